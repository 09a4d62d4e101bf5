"""The baseline files, ``baselines/<device-slug>.json``: their format and checks, the environment stored with
each entry, loading, saving and upgrading. ``python -m pytest_fusion.baselines FILE...`` upgrades files in
place. May import the folders above it (machine/ to gate/).

Modules, lowest first (each imports only those before it): ``schema``, ``environment``, ``store``.
"""
