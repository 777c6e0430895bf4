"""Rollout's server side: versions of one model side by side on one Ray Serve (`vitdeploy rollout` drives them
from vitdeploy/client/rollout/).

    routes.py     each version's application and route; what the proxy's guard routes and tells the replicas
    registry.py   the rollout registry (a detached Ray actor): live version, versions, shadow target, each
                  rollout's lease and phase, history; the proxies' cached read of its routing
    store.py      where the registry's state lives (Ray's GCS) and the routing derived from it, so routing
                  survives the registry
    shadow.py     the replicas' side of shadow traffic: copies of live requests to the candidate, their outcomes
    candidate.py  a version started beside the live one and removed, each within a bounded time

Below the rest of serve/: the deployment, the guard and the runner use it; of serve/ it uses only protocol.py's
names.
"""
