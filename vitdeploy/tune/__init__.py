"""Serving settings measured on the user's own machine: ``vitdeploy tune``, a search of the serve / Triton
settings with the load generator (vitdeploy/client/).

    space.py          what may change (the knobs and their neighbours)
    measure.py        one candidate's figure: the load where its throughput saturates
    serve_target.py   `vitdeploy serve` started here, its settings changed in place or replaced
    triton_target.py  the generated Triton repository on a tritonserver here, its models reloaded
    search.py         the search; overlay.py: tuned.yaml and tune-report.json; tuner.py: the whole run
"""
