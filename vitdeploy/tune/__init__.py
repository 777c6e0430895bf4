"""Serving settings measured on the user's own machine: ``vitdeploy loadtest`` (a load generator for any
server that speaks what ours speak) and ``vitdeploy tune`` (a search of the serve / Triton settings with it).

    clients.py       one request, in each protocol (POST /predict, KServe v2 over HTTP, over gRPC)
    loadgen.py       closed loop (N clients) and open loop (requests at a rate, timed from when each was due)
    server_stats.py  the server's own statistics (/v2/models/<m>/stats) over a level
    loadtest.py      the levels of a run, the client-limit flag, the table and the JSON
"""
