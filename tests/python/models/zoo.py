"""The model zoo: the real `transformers`, `timm` and `efficientnet_pytorch` models from pip, built
from configurations with random weights (nothing is downloaded), each as a tune factory:
`build(name, size)` → (model, inputs, loss_fn, optimizer_factory).

Training recipe: AdamW, float32, dropout off (verification compares with nothing dropped), the
transformers computing their loss from the labels (as Trainer does), and `use_cache=False` as
training scripts set it: with transformers' default a training forward builds a fresh KV cache
every step, which costs a concatenation per layer and which no graph can hold (opfuse then leaves
those modules as written and says so; test_zoo checks that reason).

Sizes: "test" is small enough for a tune in seconds on 2 cores (the tests); "bench" is a small
but realistic shape for bench/zoo.py. The architecture code is the library's own at every size.

    python3 -m opfuse tune tests/python/models/zoo.py:llama_sdpa
"""
import functools
import inspect

import torch
from torch import nn

# name → (library, builder, what a sample is)
CATALOGUE = {}

# The shapes per size: transformers (hidden, layers, heads, kv heads, intermediate, vocab, sequence,
# batch), images (image side, batch).
TEXT = {"test": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, seq=32, batch=2),
        "bench": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=8000, seq=256, batch=4)}
IMAGE = {"test": dict(side=64, batch=2), "bench": dict(side=128, batch=8)}


def _register(name, library, unit):
    def add(builder):
        CATALOGUE[name] = (library, builder, unit)
        return builder
    return add


def names(library=None):
    return [n for n, (lib, _, _) in CATALOGUE.items() if library is None or lib == library]


def build(name, size="test", seed=0):
    """The named model at the size, in training mode, with its inputs, loss and optimizer (AdamW)."""
    if name not in CATALOGUE:
        raise ValueError(f"{name}: not in the zoo ({', '.join(CATALOGUE)})")
    torch.manual_seed(seed)
    return CATALOGUE[name][1](size)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-4)


# ---- transformers ------------------------------------------------------------------------------

def _causal_lm(config_class, attn, size, **extra):
    import transformers
    s = TEXT[size]
    config = config_class(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                          num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                          num_key_value_heads=s["kv_heads"], max_position_embeddings=2 * s["seq"], use_cache=False, **extra)
    return _language_model(transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn), s)


def _language_model(model, s, labels=None):
    """Trained as transformers' own recipe trains it (Trainer, the example scripts): the batch's
    labels go into the forward, which computes the loss (the tokens themselves: a causal model
    shifts them to predict the next token; T5 reads them as its decoder's targets, its decoder's
    inputs made from them by the data collator)."""
    tokens = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
    named = dict(input_ids=tokens, labels=tokens if labels is None else labels(tokens))
    if hasattr(model, "prepare_decoder_input_ids_from_labels"):  # as DataCollatorForSeq2Seq does
        named["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=named["labels"])
    return model.train(), _positional(model, **named), _loss_inside, _adamw


def _positional(model, **named):
    """forward's positional arguments through the last one named, None between: tune takes the
    positional inputs, and transformers' forwards take labels several places after input_ids."""
    params = list(inspect.signature(model.forward).parameters)
    return tuple(named.get(p) for p in params[:1 + max(params.index(n) for n in named)])


def _loss_inside(output):
    return output.loss


def _text_model(family, builder):
    for attn in ("eager", "sdpa"):
        _register(f"{family}_{attn}", "transformers", "sequences")(functools.partial(builder, attn))


def _llama(attn, size):
    import transformers
    return _causal_lm(transformers.LlamaConfig, attn, size)


def _qwen2(attn, size):
    import transformers
    return _causal_lm(transformers.Qwen2Config, attn, size)


def _mistral(attn, size):
    import transformers
    return _causal_lm(transformers.MistralConfig, attn, size, sliding_window=None)


def _gemma(attn, size):
    import transformers
    return _causal_lm(transformers.GemmaConfig, attn, size, head_dim=TEXT[size]["hidden"] // TEXT[size]["heads"])


def _phi(attn, size):
    import transformers
    s = TEXT[size]
    config = transformers.PhiConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                                    num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                    max_position_embeddings=2 * s["seq"], resid_pdrop=0.0, embd_pdrop=0.0,
                                    attention_dropout=0.0, use_cache=False)
    return _language_model(transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn), s)


def _gpt2(attn, size):
    import transformers
    s = TEXT[size]
    config = transformers.GPT2Config(vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                                     n_positions=2 * s["seq"], bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     use_cache=False)
    return _language_model(transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn), s)


def _t5(attn, size):
    import transformers
    s = TEXT[size]
    config = transformers.T5Config(vocab_size=s["vocab"], d_model=s["hidden"], d_kv=s["hidden"] // s["heads"],
                                   d_ff=s["intermediate"], num_layers=s["layers"], num_heads=s["heads"],
                                   dropout_rate=0.0, decoder_start_token_id=0, use_cache=False)
    return _language_model(transformers.T5ForConditionalGeneration._from_config(config, attn_implementation=attn), s)


def _bert(attn, size):
    import transformers
    s = TEXT[size]
    config = transformers.BertConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                     num_attention_heads=s["heads"], intermediate_size=s["intermediate"],
                                     max_position_embeddings=2 * s["seq"], hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return _language_model(transformers.BertForMaskedLM._from_config(config, attn_implementation=attn), s, _masked)


def _masked(tokens):
    """Masked language modelling's labels: 15 % of the positions are predicted, the rest ignored
    (-100), as transformers' DataCollatorForLanguageModeling makes them."""
    return tokens.masked_fill(torch.rand(tokens.shape) >= 0.15, -100)


for _family, _builder in (("llama", _llama), ("qwen2", _qwen2), ("mistral", _mistral), ("gemma", _gemma),
                          ("phi", _phi), ("gpt2", _gpt2), ("t5", _t5), ("bert", _bert)):
    _text_model(_family, _builder)


# ---- timm and efficientnet_pytorch -------------------------------------------------------------

def _images(size, classes=10):
    s = IMAGE[size]
    return (torch.randn(s["batch"], 3, s["side"], s["side"]),), torch.randint(0, classes, (s["batch"],))


def _classifier(model, size, classes=10):
    inputs, labels = _images(size, classes)
    return model.train(), inputs, lambda out: nn.functional.cross_entropy(out, labels), _adamw


def _timm(arch, size, **extra):
    import timm
    return _classifier(timm.create_model(arch, pretrained=False, num_classes=10, **extra), size)


for _arch in ("efficientnet_b0", "resnet50", "convnext_tiny"):
    _register(f"timm_{_arch}", "timm", "images")(functools.partial(_timm, _arch))


@_register("timm_vit_small_patch16_224", "timm", "images")
def _vit(size):
    return _timm("vit_small_patch16_224", size, img_size=IMAGE[size]["side"])


@_register("efficientnet_pytorch_b0", "efficientnet_pytorch", "images")
def _efficientnet_pytorch(size):
    from efficientnet_pytorch import EfficientNet
    model = EfficientNet.from_name("efficientnet-b0", num_classes=10, image_size=IMAGE[size]["side"])
    return _classifier(model, size)


# `python -m opfuse tune tests/python/models/zoo.py:NAME` takes a factory per model.
for _name in CATALOGUE:
    globals()[_name] = functools.partial(build, _name)
