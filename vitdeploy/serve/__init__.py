"""Serving: the Ray Serve application (`vitdeploy serve`) and the wire protocol shared with Triton.

Nothing here imports Ray at import time; :mod:`vitdeploy.serve.protocol` needs numpy and Pillow only.
"""
