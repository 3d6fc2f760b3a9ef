"""Training proposers on a frozen model: what the model says is the label.

- ``data``: prompts split by question id, the model's own continuations and the hidden states generation computed,
  cached and resumable (Medusa's training data, and the held-out continuations every evaluation uses);
- ``sources`` and ``python_functions``: training text (files, folders and the running Python's own functions),
  deduplicated against held-out questions and mixed by weight;
- ``rendering``, ``labelling`` and ``shards``: conversations labelled by the target (its features and its own
  distribution, by prefill or generation), shard by shard;
- ``optimization``: what every trainer shares (AdamW with warm-up and cosine, batch order, checkpoints);
- ``medusa`` and ``medusa_evaluation``: Medusa heads, their held-out accuracy and tree for this machine;
- ``eagle_draft``, ``eagle_stream``, ``eagle_evaluation`` and ``eagle``: EAGLE-3 drafts with training-time test,
  trained on the shards as they are labelled, their evaluation, scaling curve and export;
- ``pard_layout``, ``pard_data``, ``pard``, ``pard_evaluation`` and ``lora``: a causal LM adapted into a parallel
  draft on text (no target needed), its acceptance by position and predicted speed; low-rank adapters."""
