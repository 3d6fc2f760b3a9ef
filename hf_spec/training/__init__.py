"""Training proposers on a frozen model: one data pipeline (``data``: prompts split by question id, the model's own
continuations and the hidden states generation computed, cached and resumable), the training text (``sources``:
files, folders and the running Python's own functions (``python_functions``), deduplicated against held-out
questions and mixed by weight), what every trainer shares (``optimization``: AdamW with warm-up and cosine, batch
order, checkpoints) and its consumers (``medusa`` and ``medusa_evaluation``: Medusa heads, their held-out accuracy
and tree for this machine; ``eagle``: EAGLE-3 drafts with training-time test, their evaluation and export)."""
