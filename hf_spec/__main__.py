"""``python -m hf_spec``: the ``hf-spec`` command line, for a checkout that is not installed."""
from .cli import main

raise SystemExit(main())
