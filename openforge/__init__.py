"""OpenForge's shared foundation: errors, configuration, the data dir and the run store.

Every other package (`engine`, `proxy`, `sandbox`, `rollouts`, `trainer`, `forge_cli`) imports from
here; this package imports none of them.
"""

__version__ = "0.1.0"
