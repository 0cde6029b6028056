"""Decoder language models by name, built by transformers from a config at sizes defined here: random weights,
nothing downloaded. Two families, as most of what people pre-train and fine-tune is one or the other:

  llama-*: Llama-style (RMSNorm, rotary positions, SwiGLU, no biases, untied output layer)
  gpt2-*:  GPT-2-style (LayerNorm, learned positions, GELU MLP, tied output layer)

at sizes tiny (the CPU default: about 2M parameters besides the embeddings, trains in minutes on 2 cores),
small (about 20M) and 125m / 350m (the usual GPU sizes, as GPT-2 small and medium). The vocabulary is the
data's (its tokenizer's), the context length the run's --seq-len."""
from __future__ import annotations

# The names and sizes live where nothing imports torch, so the CLI can check a name before torch loads
from ..modelnames import DEFAULT_LM_MODEL, LM_MODELS, ModelError, check_lm_model_name  # noqa: F401  (re-exported)
from ..modelnames import LM_SIZES as SIZES
from ..quiet import quiet_imports

LLAMA_MLP = {"tiny": 352, "small": 1024, "125m": 2048, "350m": 2816}


def lm_config(name: str, vocab_size: int, max_positions: int, pad_id: int | None = None, eos_id: int | None = None):
    """The transformers config of `name` for this vocabulary and context length. attn_implementation is left to
    transformers (its default, sdpa where torch has it): the attention switch sets another one per run."""
    check_lm_model_name(name)
    from transformers import GPT2Config, LlamaConfig

    family, size = name.split("-", 1)
    hidden, layers, heads, mlp = SIZES[size]
    tokens = {"pad_token_id": pad_id, "eos_token_id": eos_id, "bos_token_id": eos_id}
    if family == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=LLAMA_MLP[size],
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           max_position_embeddings=max_positions, tie_word_embeddings=False, use_cache=False,
                           **tokens)
    return GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads, n_inner=mlp,
                      n_positions=max_positions, use_cache=False, **tokens)


def build_lm(name: str, vocab_size: int, max_positions: int, pad_id: int | None = None, eos_id: int | None = None):
    """A randomly initialized causal LM (the same weights for the same torch seed)."""
    # transformers imports its quantizers (torchao among them) on the first model it builds: their notices held
    with quiet_imports():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(lm_config(name, vocab_size, max_positions, pad_id, eos_id))


def flops_per_token(model, context: float) -> float:
    """Training FLOPs of one token (forward + backward): 6 x the parameters a token's matrices use (everything
    but the embedding lookups), plus attention's 12 x layers x width x context (its two matrix products with
    `context` keys, forward and backward; PaLM's accounting). `context`: the mean number of positions a token
    attends over in the batches actually run."""
    config = model.config
    embeddings = {id(m.weight) for m in model.modules() if type(m).__name__ == "Embedding"}
    head = model.get_output_embeddings()
    dense = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    if head is not None and id(head.weight) in embeddings:       # tied: the output layer is a product all the same
        dense += head.weight.numel()
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    width = getattr(config, "hidden_size", None) or config.n_embd
    return 6.0 * dense + 12.0 * layers * width * context
