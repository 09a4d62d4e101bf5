"""How a kernel is timed, usable without pytest: timers, whether their L2 flush leaves the L2 cold,
speedup statistics, SM clock and power over the timed rounds (NVML), fresh inputs and the recompute
check, the rounds, the measurement loop, the record that crosses pytest-xdist, providers, device peaks
and the record against them. May import machine/, declare/, oracle/ and property/. Importing this
package imports neither torch nor pytest.

Modules, lowest first (each imports only those before it): ``stats``, ``timers``, ``cold_l2``, ``power``,
``recompute``, ``rounds``, ``timing``, ``record``, ``providers``, ``peaks``, ``peak_bound``.
"""
