"""Whisper tokenizer over a tokenizer.json: special, language, task and timestamp tokens read from the file."""

from __future__ import annotations

import string
from functools import cached_property
from pathlib import Path

from tokenizers import AddedToken, Tokenizer as HFTokenizer

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
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
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
