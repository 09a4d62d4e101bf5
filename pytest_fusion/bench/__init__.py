"""A bench case timed and judged, without pytest: the case's providers measured (and re-measured once when
that can change its verdict), the plain API (:func:`bench_case`, :func:`judge`) and the slow-shape search
over a spec's dims. May import every folder above it; reference_kernels imports this far and no further.

Modules, lowest first (each imports only those before it): ``timed_case``, ``api``, ``explore``.
"""
