"""`vitdeploy rollout`, the client's side: a new export onto a running `vitdeploy serve`, promoted or rolled back.

    driver.py  the steps: the registry's version number, the candidate started, checked against its own export,
               shadowed, promoted or removed
    server.py  what it asks the running server over HTTP before it touches anything, and after
    faithful.py the candidate's answers to its export's validation images against its eager answers
    gate.py    the candidate's answers to shadowed live requests beside the live version's: errors and latency
               gate; agreement is measured (it gates with --min-agreement / --same-model)
    lease.py   this process's lease on its model in the registry (renewed in the background, fenced when taken
               over), joining the server's Ray, removing what an abandoned rollout left
    status.py  `vitdeploy rollout --status`: the registry's account after converging expired rollouts
    hold.py    TEST-ONLY: holds the command at a phase so that the crash tests kill it there

The server's side (registry, shadow copies, candidate start and removal) is vitdeploy/serve/rollout/.
"""
