"""Training proposers on a frozen model by self-distillation: the data pipeline (``data``: prompts split by
question id, the model's own continuations and the hidden states generation computed, cached) and its
consumers (``medusa``: Medusa heads, ``medusa_evaluation``: their held-out accuracy and the tree for this
machine)."""
