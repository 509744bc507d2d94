"""The jobs behind the ``turnloom`` command line: replay, load test, trajectories.

Not part of the library's API: :mod:`turnloom.cli` drives these modules, and
scripts and tests use them. Layering: tools import the runtime, context and
areas; nothing in the library imports tools.

* :mod:`turnloom.tools.trajectories` -- reading recorded transcripts, the
  built-in workload.
* :mod:`turnloom.tools.transcript` -- the one driver that walks a transcript
  into turns, replies and outputs.
* :mod:`turnloom.tools.replay` -- ``turnloom replay``.
* :mod:`turnloom.tools.loadtest` -- ``turnloom loadtest``.
* :mod:`turnloom.tools.workload` -- the generated, deterministic workload.
* ``data/`` -- five real tau-bench trajectories (``replay --sample``), with
  their ``SOURCE.md`` and ``LICENSE``.
"""
