"""The engine every strategy runs on: one loop (``loop``) over a proposer (``proposer``), the target with its
KV cache (``runner``, ``cache``), trees as data (``trees``), the schedules of k (``schedule``, ``auto``, with
what they keep across calls in ``memory``), one cost model (``costs``, measured by ``timing``), the statistics
(``stats``) and the output ``generate()`` returns (``output``). ``call`` is the preamble every strategy's
``custom_generate`` callable shares."""
