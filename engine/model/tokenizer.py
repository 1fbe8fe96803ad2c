"""Whisper tokenizer over a tokenizer.json: special, language, task and timestamp tokens read from the file."""

from __future__ import annotations

import json
import string
from functools import cached_property
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from engine.model.dims import ModelDimensions

# ISO-639-1 code -> English name, in Whisper's language-token order (openai/whisper tokenizer.py).
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak",
    "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian",
    "az": "azerbaijani", "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian",
    "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian", "ne": "nepali",
    "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan",
    "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati",
    "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese",
    "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese",
    "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala",
    "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}  # fmt: skip

NUM_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|> in steps of 0.02 s
TIME_PRECISION = 0.02

# openai/whisper's special tokens follow the text tokens in this order (get_encoding): eot, sot, one token per
# language, these six, then the timestamps. So a checkpoint's n_vocab and language count fix every special id.
TASK_AND_CONTROL_TOKENS = (
    "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"
)
NO_SPEECH_NAMES = ("<|nospeech|>", "<|nocaptions|>")  # Systran-era tokenizer.json files use the older name

# The released vocabularies, for error messages: size -> (what it is, its language tokens, the tokenizer.json to pass).
KNOWN_VOCABULARIES = {
    51864: ("English-only", 99, "an English-only tokenizer.json of tiny.en to medium.en (e.g. tiny.en's)"),
    51865: ("multilingual: 99 languages", 99, "a multilingual tokenizer.json of tiny to large-v2 (e.g. base's)"),
    51866: ("large-v3: 100 languages", 100, "large-v3's tokenizer.json"),
}


class TokenizerMismatchError(ValueError):
    """The tokenizer's vocabulary or special-token ids differ from the checkpoint's: every transcript would be wrong."""


def expected_special_ids(dims: ModelDimensions) -> dict[str, int]:
    """Token -> id that a checkpoint of these dims was trained with (openai/whisper's layout)."""
    num_languages = dims.num_languages
    eot = dims.n_vocab - NUM_TIMESTAMPS - len(TASK_AND_CONTROL_TOKENS) - num_languages - 2
    ids = {"<|endoftext|>": eot, "<|startoftranscript|>": eot + 1}
    ids |= {f"<|{code}|>": eot + 2 + i for i, code in enumerate(list(LANGUAGES)[:num_languages])}
    after_languages = eot + 2 + num_languages
    ids |= {token: after_languages + i for i, token in enumerate(TASK_AND_CONTROL_TOKENS)}
    timestamp_begin = after_languages + len(TASK_AND_CONTROL_TOKENS)
    return ids | {"<|0.00|>": timestamp_begin, "<|30.00|>": timestamp_begin + NUM_TIMESTAMPS - 1}


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table, which Whisper's vocabulary uses): bytes
    that are printable Latin-1 stand for themselves, the others for the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_OF_CHAR = _byte_level_alphabet()


class Tokenizer:
    """Whisper's special-token layout derived from one tokenizer.json (English-only and multilingual differ)."""

    def __init__(self, hf: HFTokenizer, num_languages: int, is_multilingual: bool):
        self.hf = hf
        self.is_multilingual = is_multilingual
        self.eot = self._id("<|endoftext|>")
        self.sot = self._id("<|startoftranscript|>")
        self.translate = self._id("<|translate|>")
        self.transcribe = self._id("<|transcribe|>")
        self.sot_lm = self._id("<|startoflm|>")
        self.sot_prev = self._id("<|startofprev|>")
        self.no_speech = self._first_id("<|nospeech|>", "<|nocaptions|>")
        self.no_timestamps = self._id("<|notimestamps|>")
        self.timestamp_begin = self.no_timestamps + 1
        # Language tokens sit right after <|startoftranscript|>, one per language the model knows.
        codes = list(LANGUAGES)[:num_languages]
        self.language_ids = {c: t for c in codes if (t := self.hf.token_to_id(f"<|{c}|>")) is not None}
        self.language_codes = {tid: code for code, tid in self.language_ids.items()}
        self._ensure_timestamp_tokens()

    @classmethod
    def from_file(cls, path: str | Path, num_languages: int, is_multilingual: bool) -> Tokenizer:
        return cls(HFTokenizer.from_file(str(path)), num_languages, is_multilingual)

    @classmethod
    def for_model(cls, path: str | Path, dims: ModelDimensions, *, add_languages: bool = False) -> Tokenizer:
        """The tokenizer in `path`, checked against the checkpoint (TokenizerMismatchError if it does not fit).

        add_languages: a multilingual tokenizer with fewer languages than the checkpoint (99 where large-v3 has 100)
        takes the missing language tokens and the shifted task, control and timestamp ids (add_language_tokens)."""
        hf = HFTokenizer.from_file(str(path))
        if add_languages:
            hf = add_language_tokens(hf, dims) or hf
        tokenizer = cls(hf, dims.num_languages, dims.is_multilingual)
        tokenizer.check_fits(dims, str(path))
        return tokenizer

    def check_fits(self, dims: ModelDimensions, source: str = "the tokenizer") -> None:
        """Raises TokenizerMismatchError unless the size and every special id are those the checkpoint expects."""
        size = self.hf.get_vocab_size(with_added_tokens=True)
        num_languages = self.translate - self.sot - 1  # the language tokens sit between these two
        if size != dims.n_vocab:
            raise TokenizerMismatchError(
                f"tokenizer {source} does not fit the checkpoint: the checkpoint has a vocabulary of {dims.n_vocab} "
                f"tokens ({_describe(dims.n_vocab, dims.num_languages)}) but the tokenizer has {size} "
                f"({_describe(size, num_languages)}); pass --tokenizer with {_hint(dims.n_vocab)}"
            )
        wrong = []
        for token, want in expected_special_ids(dims).items():
            if not dims.is_multilingual and token[2:-2] in LANGUAGES:
                continue  # English-only models take no language token (tiny.en's tokenizer names Hebrew <|iw|>)
            names = NO_SPEECH_NAMES if token in NO_SPEECH_NAMES else (token,)
            got = next((tid for name in names if (tid := self.hf.token_to_id(name)) is not None), None)
            if got != want:
                wrong.append(f"{token} is {got}, expected {want}")
        if wrong:
            raise TokenizerMismatchError(
                f"tokenizer {source} does not fit the checkpoint: it has the size of the checkpoint's vocabulary "
                f"({dims.n_vocab} tokens) but not its special-token ids ({'; '.join(wrong)}); pass --tokenizer with "
                f"{_hint(dims.n_vocab)}"
            )

    def _id(self, token: str) -> int:
        tid = self.hf.token_to_id(token)
        if tid is None:
            raise ValueError(f"tokenizer.json has no {token} token; is it a Whisper tokenizer?")
        return tid

    def _first_id(self, *tokens: str) -> int:
        for token in tokens:
            if (tid := self.hf.token_to_id(token)) is not None:
                return tid
        raise ValueError(f"tokenizer.json has none of {tokens}")

    def _ensure_timestamp_tokens(self) -> None:
        # Older (Systran-era) tokenizer.json files lack <|0.00|>..<|30.00|>; their ids are implied
        # (timestamp_begin + i), so append them where the vocabulary ends right before them.
        if self.hf.token_to_id("<|0.00|>") is not None:
            return
        if self.hf.get_vocab_size(with_added_tokens=True) != self.timestamp_begin:
            raise ValueError("tokenizer.json lacks timestamp tokens and cannot take them at the expected ids")
        self.hf.add_tokens(
            [AddedToken(f"<|{i * TIME_PRECISION:.2f}|>", normalized=True, special=False) for i in range(NUM_TIMESTAMPS)]
        )
        assert self.hf.token_to_id("<|0.00|>") == self.timestamp_begin

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of the text tokens only (timestamps and specials dropped)."""
        return self.hf.decode([t for t in tokens if t < self.eot])

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one text token (a token can hold part of a UTF-8 character, so its text alone can't say)."""
        return bytes(_BYTE_OF_CHAR[c] for c in self.hf.id_to_token(token))

    def decode_with_timestamps(self, tokens: list[int]) -> str:
        out, text = [], []
        for t in tokens:
            if t >= self.timestamp_begin:
                out.append(self.hf.decode(text))
                text = []
                out.append(f"<|{(t - self.timestamp_begin) * TIME_PRECISION:.2f}|>")
            elif t < self.eot:
                text.append(t)
        out.append(self.hf.decode(text))
        return "".join(out)

    def sot_sequence(self, language: str | None, task: str) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>]; English-only models take no language or task."""
        if not self.is_multilingual:
            return [self.sot]
        seq = [self.sot]
        if language is not None:
            seq.append(self.language_ids[language])
            seq.append(self.translate if task == "translate" else self.transcribe)
        return seq

    def task_token(self, task: str) -> int:
        return self.translate if task == "translate" else self.transcribe

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens for speaker tags and sound annotations (♪, [MUSIC], (laughs)), suppressed by default."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += ["<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))", "(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪"]
        # These share their first UTF-8 bytes, so suppressing the first token of each is safe.
        miscellaneous = set("♩♪♫♬♭♮♯")
        # Hyphens and apostrophes are fine inside words, not at their start.
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + list(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def default_suppress_tokens(self) -> list[int]:
        """Whisper's `suppress_tokens=[-1]`: non-speech symbols plus the task and control tokens."""
        ids = set(self.non_speech_tokens)
        ids.update([self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech])
        return sorted(ids)

    def split_to_word_tokens(self, tokens: list[int], language: str | None) -> tuple[list[str], list[list[int]]]:
        """Group text tokens into words: by unicode points for space-less scripts, else by spaces."""
        if language in {"zh", "ja", "th", "lo", "my", "yue"}:
            return self._split_by_unicode(tokens)
        return self._split_by_spaces(tokens)

    def _split_by_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        words, word_tokens, current = [], [], []
        for token in tokens:
            current.append(token)
            decoded = self.decode_with_timestamps(current)
            # A partial UTF-8 sequence decodes to U+FFFD: wait for the rest of the character.
            if "\ufffd" not in decoded:
                words.append(decoded)
                word_tokens.append(current)
                current = []
        return words, word_tokens

    def _split_by_spaces(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        subwords, subword_tokens = self._split_by_unicode(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, toks in zip(subwords, subword_tokens):
            special = toks[0] >= self.eot
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or not words:
                words.append(subword)
                word_tokens.append(list(toks))
            else:
                words[-1] += subword
                word_tokens[-1].extend(toks)
        return words, word_tokens


def _describe(size: int, num_languages: int) -> str:
    label, languages, _ = KNOWN_VOCABULARIES.get(size, (None, None, None))
    return label if languages == num_languages else f"{num_languages} languages"


def _hint(n_vocab: int) -> str:
    _, _, hint = KNOWN_VOCABULARIES.get(n_vocab, (None, None, "the tokenizer.json released with this checkpoint"))
    return hint


def add_language_tokens(hf: HFTokenizer, dims: ModelDimensions) -> HFTokenizer | None:
    """A multilingual tokenizer extended to the checkpoint's larger language count, or None where that is not exact.

    openai/whisper builds every multilingual vocabulary from the same text tokens (multilingual.tiktoken) and lays
    out the special tokens by one rule for any language count (expected_special_ids), so large-v3's tokenizer is
    base's with <|yue|> after <|su|> and the task, control and timestamp ids one higher (yue 50358, translate 50359,
    transcribe 50360, startoflm 50361, startofprev 50362, nospeech 50363, notimestamps 50364, <|0.00|> 50365).
    That holds only for a tokenizer that itself follows the rule; anything else is left alone, and the fit check
    then refuses it."""
    data = json.loads(hf.to_str())
    added = sorted(data.get("added_tokens", []), key=lambda token: token["id"])
    codes = [code for code in LANGUAGES if hf.token_to_id(f"<|{code}|>") is not None]
    have, want = len(codes), dims.num_languages
    if not dims.is_multilingual or not 0 < have < want <= len(LANGUAGES) or codes != list(LANGUAGES)[:have]:
        return None
    eot = expected_special_ids(dims)["<|endoftext|>"]
    # The source must be openai/whisper's layout for `have` languages on as many text tokens as the target has
    # (the multilingual 50257; English-only tokenizers have GPT-2's 50256), its timestamps present or not.
    order = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in codes), *TASK_AND_CONTROL_TOKENS]
    timestamps = [f"<|{i * TIME_PRECISION:.2f}|>" for i in range(NUM_TIMESTAMPS)]
    contents = ["<|nospeech|>" if token["content"] in NO_SPEECH_NAMES else token["content"] for token in added]
    consecutive = [token["id"] for token in added] == list(range(eot, eot + len(added)))
    text_first = max(data["model"]["vocab"].values()) <= eot  # no text token at or after the specials
    if contents not in (order, order + timestamps) or not consecutive or not text_first:
        return None
    shift = want - have
    first_after_languages = 2 + have
    new_languages = [
        {**added[first_after_languages - 1], "id": eot + 2 + have + i, "content": f"<|{code}|>"}
        for i, code in enumerate(list(LANGUAGES)[have:want])
    ]
    rest = [{**token, "id": token["id"] + shift} for token in added[first_after_languages:]]
    data["added_tokens"] = added[:first_after_languages] + new_languages + rest
    ids = {token["content"]: token["id"] for token in data["added_tokens"]}
    # The post-processor's template names special tokens with their ids; those ids move too.
    for special in (data.get("post_processor") or {}).get("special_tokens", {}).values():
        special["ids"] = [ids.get(token, tid) for token, tid in zip(special["tokens"], special["ids"])]
    return HFTokenizer.from_str(json.dumps(data))
