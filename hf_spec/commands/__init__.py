"""The ``hf-spec`` commands, one module each: ``NAME``, ``HELP``, ``add_arguments(parser)``, ``check(args)`` (what
can be checked before anything loads: raises ValueError) and ``run(args) -> exit status``. ``hf_spec.cli`` is the
table that dispatches to them."""
