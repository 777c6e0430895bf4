"""Tiny two-tower contrastive checkpoints, saved as transformers saves them, with a tokenizer made here (no
downloads): a random-weight ``CLIPModel`` (byte-level BPE ``CLIPTokenizer`` over single characters) and a
``SiglipModel`` (a tokenizers-library Unigram tokenizer in SentencePiece's style, since SigLIP's own tokenizer
needs the sentencepiece package). The real structure at tiny widths: the zero-shot tests' checkpoints.

``sharpen``: the logit scale both models multiply their cosines by, large enough that random towers give a
clear top-1 (no tie) on the demo photos.
"""

from __future__ import annotations

import string
from pathlib import Path

IMAGE, PATCH, WIDTH, PROJ = 32, 8, 64, 32
CLIP_SPECIALS = ("<|startoftext|>", "<|endoftext|>")


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, the alphabet of CLIP's byte-level BPE."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def clip_tokenizer():
    """A CLIPTokenizer whose words split into single bytes (no merges): every text tokenises."""
    from transformers import CLIPTokenizer

    chars = _bytes_to_unicode()
    vocab = {t: i for i, t in enumerate([*CLIP_SPECIALS, *chars, *(c + "</w>" for c in chars)])}
    return CLIPTokenizer(vocab=vocab, merges=[])


def siglip_tokenizer():
    """A SentencePiece-style Unigram tokenizer ("</s>" appended and used as padding, as SigLIP's)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_lowercase + string.digits + ".,'-!?")
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + c, -3.0) for c in chars] + [(c, -4.0) for c in chars]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>", unk_token="<unk>")


def _randomize(model, seed: int):
    from helpers.library_reference import randomize_

    return randomize_(model, seed)


def save_tiny_clip(folder: Path, seed: int = 0, sharpen: float = 60.0) -> Path:
    """A random-weight CLIPModel (vision 64 wide, 2 blocks, 32 px, patch 8, QuickGELU; projection 32) with its
    tokenizer and CLIPImageProcessor, saved in ``folder``."""
    import math

    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer = clip_tokenizer()
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE,
        patch_size=PATCH,
    )
    torch.manual_seed(seed)
    model = _randomize(CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=PROJ)), seed)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(sharpen))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}).save_pretrained(
        folder
    )
    return Path(folder)


def save_tiny_siglip(folder: Path, seed: int = 0, sharpen: float = 60.0, bias: float = -2.0) -> Path:
    """A random-weight SiglipModel (vision 64 wide, 2 blocks, 32 px, patch 8, attention pooling; text 64 wide,
    64 positions) with its tokenizer and SiglipImageProcessor, saved in ``folder``; logit bias ``bias``."""
    import math

    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    tokenizer = siglip_tokenizer()
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision = dict(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE,
        patch_size=PATCH,
    )
    torch.manual_seed(seed)
    model = _randomize(SiglipModel(SiglipConfig(text_config=text, vision_config=vision)), seed)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(sharpen))
        model.logit_bias.fill_(bias)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE}).save_pretrained(folder)
    return Path(folder)
