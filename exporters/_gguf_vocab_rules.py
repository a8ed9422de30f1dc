"""llama.cpp's vocabulary rules as data (src/llama-vocab.cpp), which :mod:`._gguf_vocab` builds a
tokenizer from: token types and the attributes llama.cpp derives from them, the texts it makes
control or end-of-generation tokens, the metadata keys of special ids, and for each
``tokenizer.ggml.pre`` name the regular expressions its byte-level BPE splits text with
(``llm_tokenizer_bpe``, as Oniguruma reads them), whether merges are skipped for a piece that is a
token whole, and the BOS default."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsample.text.llama_tokens import EOT_TEXTS, FIM_TEXTS

__all__ = [
    "ATTR",
    "A_BYTE",
    "A_CONTROL",
    "A_NORMAL",
    "A_UNKNOWN",
    "A_UNUSED",
    "A_USER",
    "EOG_TEXTS",
    "EOT_TEXTS",
    "FIM_TEXTS",
    "ID_KEYS",
    "PRE_TOKENIZERS",
    "REGEXES",
    "SPLIT",
    "T_BYTE",
    "T_CONTROL",
    "T_NORMAL",
    "T_UNDEFINED",
    "T_UNKNOWN",
    "T_UNUSED",
    "T_USER_DEFINED",
    "PreTokenizer",
]

# llama.cpp's token types (gguf's TokenType) and the attributes it derives from them.
T_UNDEFINED, T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED, T_UNUSED, T_BYTE = range(7)
A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER, A_BYTE = 1, 2, 4, 8, 16, 32
ATTR = {T_NORMAL: A_NORMAL, T_UNKNOWN: A_UNKNOWN, T_CONTROL: A_CONTROL,
         T_USER_DEFINED: A_USER, T_UNUSED: A_UNUSED, T_BYTE: A_BYTE}  # fmt: skip
SPLIT = A_CONTROL | A_USER | A_UNKNOWN  # the tokens llama.cpp splits the text on

# Texts llama.cpp makes CONTROL when a vocabulary has them (llama_vocab::impl::load): the
# end-of-generation tokens, and the first of each FIM kind whose id the metadata does not give
# (FIM_TEXTS, and EOT_TEXTS for the end of turn: onnxsample.text.llama_tokens).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
              "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
              "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")  # fmt: skip
ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id", "fim_pre": "fim_pre_token_id",
            "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
            "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id",
            "fim_sep": "fim_sep_token_id"}  # fmt: skip

# llama.cpp's pre-tokenizer regular expressions (llm_tokenizer_bpe), as Oniguruma reads them. The
# GPT-2 one ends in `|\s+`: llama.cpp runs its own code for that expression, which matches so.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+<c>"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*<c>")  # fmt: skip
_DEEPSEEK3 = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
REGEXES: dict[str, tuple[str, ...]] = {
    "llama3": (_LLAMA3,),
    "deepseek-llm": (
        r"[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
        "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
        "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
        "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
        "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
        "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
        "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
        "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
        "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
        "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
        "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
        "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\z",  # llama.cpp's `$`: the end of the piece (Oniguruma's `$` is the end of a line)
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-v3": (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _DEEPSEEK3),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
    "tekken": (
        _CASED.replace("<c>", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "gpt-4o": (
        _CASED.replace("<c>", _CONTRACTIONS + "?")
        + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),
    "minicpm5": (
        r"\p{N}{1,3}",
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gemma4": (r"[^\n]+|[\n]+",),
}


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp reads one ``tokenizer.ggml.pre`` name: its expressions and flags."""

    regexes: str  # a key of REGEXES
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent
    no_bos: bool = False  # llama.cpp drops the BOS id (ChatGLM)


def _pres() -> dict[str, PreTokenizer]:
    table: dict[str, PreTokenizer] = {}
    groups: list[tuple[PreTokenizer, tuple[str, ...]]] = [
        (PreTokenizer("llama3", ignore_merges=True, add_bos=True),
         ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano")),
        (PreTokenizer("llama3"), ("dbrx", "smaug-bpe")),
        (PreTokenizer("deepseek-llm"), ("deepseek-llm",)),
        (PreTokenizer("deepseek-coder"), ("deepseek-coder",)),
        (PreTokenizer("deepseek-v3"), ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm")),
        (PreTokenizer("falcon"), ("falcon",)),
        (PreTokenizer("starcoder"), ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                             "minerva-7b", "mellum2")),
        (PreTokenizer("gpt-2"), ("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt",
                         "olmo", "jais", "trillion", "granite-docling")),
        (PreTokenizer("qwen2"), ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
                         "hunyuan", "solar-open", "grok-2")),
        (PreTokenizer("qwen35"), ("qwen35",)),
        (PreTokenizer("bloom"), ("poro-chat", "bloom", "gpt3-finnish")),
        (PreTokenizer("llama3", no_bos=True), ("chatglm-bpe",)),
        (PreTokenizer("llama3", ignore_merges=True, no_bos=True), ("glm4", "glm5")),
        (PreTokenizer("viking"), ("viking",)),
        (PreTokenizer("tekken", ignore_merges=True, add_bos=True), ("tekken",)),
        (PreTokenizer("gpt-4o"), ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")),
        (PreTokenizer("seed-coder"), ("seed-coder",)),
        (PreTokenizer("bailingmoe"), ("bailingmoe", "bailingmoe2", "llada-moe")),
        (PreTokenizer("ufakzeka"), ("ufakzeka",)),
        (PreTokenizer("laguna"), ("laguna",)),
        (PreTokenizer("minicpm5", ignore_merges=True), ("minicpm5",)),
        (PreTokenizer("default"), ("default", "")),
    ]  # fmt: skip
    for pre, names in groups:
        table.update(dict.fromkeys(names, pre))
    return table


PRE_TOKENIZERS = _pres()
