"""`vitdeploy rollout`, the client's side: a new export onto a running `vitdeploy serve`, promoted or rolled back.

    driver.py  the steps: the registry's version number, the candidate started, shadowed, promoted or removed
    server.py  what it asks the running server over HTTP before it touches anything, and after
    gate.py    the candidate's answers to shadowed live requests judged against the live version's

The server's side (registry, shadow copies, candidate start and removal) is vitdeploy/serve/rollout/.
"""
