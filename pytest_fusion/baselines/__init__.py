"""The baseline files, ``baselines/<device-slug>.json``: their format and checks, the environment stored with
each entry, loading, saving, upgrading and dropping entries. ``python3 -m pytest_fusion.baselines FILE...``
upgrades files in place, ``python3 -m pytest_fusion.baselines prune FILE`` drops a file's stale entries
(``--help``). May import the folders above it (machine/ to gate/); its ``__main__`` command line sits above
every folder (``prune`` collects the tests through the plugin).

Modules, lowest first (each imports only those before it): ``schema``, ``environment``, ``store``.
"""
