"""A PhoenixPipeline's life: its stages made and kept (reconcile.py), paused in order (lifecycle.py), its status
summed from theirs (summary.py), restarts and replays passed on (requests.py), all run by loop.py."""
