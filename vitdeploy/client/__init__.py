"""The client side of a running deployment: what vitdeploy asks of a server it did not start, or of one it did.

    connection.py    the one HTTP client: base URL, bearer token, CA bundle (every call to a server goes through it)
    protocols.py     one request, in each protocol (POST /predict, KServe v2 over HTTP, over gRPC)
    loadgen.py       closed loop (N clients) and open loop (requests at a rate, timed from when each was due)
    server_stats.py  the server's own statistics (/v2/models/<m>/stats) over a level
    loadtest.py      `vitdeploy loadtest`: the levels of a run, the client-limit flag, the table and the JSON
    served_check.py  `vitdeploy validate --url`: a running server's answers against eager PyTorch
    served_report.py what it found: drift-report.json's ``served`` section and its table
    rollout/         `vitdeploy rollout`: the driver, what it asks the server, the gate that judges the candidate

Above serve/ (its wire protocol and, for a rollout, its Ray side), evaluate/ (drift's judgement) and export/
(the comparator the rollout gate uses); below tune/, whose search measures with these clients.
"""
