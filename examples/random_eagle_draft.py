"""Write a randomly initialised EAGLE-3 draft at a target's real shape, to check exactness and cost before a
trained draft exists (speed does not depend on weight values; acceptance does, so its tokens/step mean nothing).

    python examples/random_eagle_draft.py --target $HF_SPEC_MODELS/qwen2.5-coder-1.5b-instruct --output /tmp/eagle
    hf-spec bench --target $HF_SPEC_MODELS/qwen2.5-coder-1.5b-instruct --eagle-model /tmp/eagle \
        --modes vanilla,eagle --per-category 1 --limit 4 --dtype bfloat16
"""
import argparse

import torch
from transformers import AutoConfig, LlamaConfig

from hf_spec.eagle import EagleDraft, save_eagle_draft
from hf_spec.token_map import TokenMap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target model (folder or Hub id): its config only")
    parser.add_argument("--output", required=True)
    parser.add_argument("--draft-vocab-size", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    target = AutoConfig.from_pretrained(args.target).get_text_config()
    layers = target.num_hidden_layers
    config = LlamaConfig(hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                         num_attention_heads=target.num_attention_heads, num_key_value_heads=target.num_key_value_heads,
                         vocab_size=target.vocab_size, num_hidden_layers=1, rms_norm_eps=target.rms_norm_eps,
                         max_position_embeddings=target.max_position_embeddings,
                         rope_theta=getattr(target, "rope_theta", None) or 10000.0)
    token_map = TokenMap.lowest_ids(args.draft_vocab_size, target.vocab_size)
    torch.manual_seed(args.seed)
    draft = EagleDraft(config, 3, 3 * target.hidden_size, token_map=token_map,
                       aux_layers=(2, layers // 2, layers - 3))
    for name, parameter in draft.named_parameters():
        if parameter.dim() > 1:
            torch.nn.init.normal_(parameter, std=0.02)
    save_eagle_draft(draft.to(torch.bfloat16), args.output)
    print(f"wrote {args.output}: {sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M parameters, "
          f"layers {draft.aux_layers}, draft vocabulary {token_map.size}")


if __name__ == "__main__":
    main()
