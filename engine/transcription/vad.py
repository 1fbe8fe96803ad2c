"""Voice activity detection: speech spans of 16 kHz audio from Silero VAD, run batched on the CPU.

Silero's own `get_speech_timestamps` calls its recurrent TorchScript model once per 32 ms frame from Python,
which costs tens of ms per second of audio on a CPU core and would stall the engine loop. The network is small:
a strided-conv front end that needs no state, then one LSTM cell. So this file runs the front end on every
frame at once and the LSTM as one `nn.LSTM` call, with the weights of the wheel's TorchScript model, and hands
the probabilities to silero's own span logic (`get_speech_timestamps_from_probs`).
tests/unit/test_vad.py checks the probabilities against silero's JIT model.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.audio.constants import SAMPLE_RATE
from engine.request import ChunkingOptions

FRAME_SAMPLES = 512  # silero's frame at 16 kHz (32 ms)
CONTEXT_SAMPLES = 64  # each frame sees the last samples of the previous one
MIN_SPEECH_MS = 250  # silero's default: shorter bursts are dropped
ENCODE_BLOCK_FRAMES = 8192  # bounds the front end's memory on long audio (~4.4 min per block)


class SileroVAD(nn.Module):
    """Silero VAD's 16 kHz network: STFT as a conv, four conv layers, an LSTM cell, a sigmoid head."""

    def __init__(self) -> None:
        super().__init__()
        self.stft_conv = nn.Conv1d(1, 258, kernel_size=256, stride=128, bias=False)  # real + imaginary, 129 bins
        self.conv1 = nn.Conv1d(129, 128, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, kernel_size=3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, 128, kernel_size=3, padding=1)
        self.lstm = nn.LSTM(128, 128, batch_first=True)
        self.final_conv = nn.Conv1d(128, 1, kernel_size=1)

    @classmethod
    def from_package(cls) -> SileroVAD:
        """The network of the `silero-vad` wheel's default model (`load_silero_vad()`, TorchScript)."""
        with warnings.catch_warnings():  # its loader uses deprecated importlib and TorchScript calls
            warnings.simplefilter("ignore", DeprecationWarning)
            jit = _import_silero().load_silero_vad(onnx=False)._model  # the 16 kHz network
        renames = {"stft.forward_basis_buffer": "stft_conv.weight", "decoder.decoder.2.": "final_conv."}
        renames |= {f"encoder.{i}.reparam_conv.": f"conv{i + 1}." for i in range(4)}
        renames |= {
            f"decoder.rnn.{name}": f"lstm.{name}_l0" for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        }
        state = {}
        for key, value in jit.state_dict().items():
            prefix = next(p for p in renames if key.startswith(p))
            state[renames[prefix] + key[len(prefix) :]] = value
        model = cls()
        model.load_state_dict(state)  # strict: every layer is accounted for
        return model.eval()

    def encode(self, frames: Tensor) -> Tensor:
        """frames : Tensor, shape = (num_frames, CONTEXT_SAMPLES + FRAME_SAMPLES) -> (num_frames, 128)"""
        x = F.pad(frames.unsqueeze(1), (0, CONTEXT_SAMPLES), mode="reflect")
        x = self.stft_conv(x)
        x = (x[:, :129] ** 2 + x[:, 129:] ** 2).sqrt()
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return F.relu(self.conv4(x)).squeeze(-1)

    def forward(self, frames: Tensor, state: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Speech probability of each frame, in order: (num_frames, 576) -> (num_frames,)"""
        return self.stream(frames, state)[0]

    def stream(
        self, frames: Tensor, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """forward() continuing from the LSTM `state` an earlier call returned: a stream in pieces gets the
        probabilities the whole stream would."""
        features = torch.cat([self.encode(block) for block in frames.split(ENCODE_BLOCK_FRAMES)])
        with _one_thread():  # one 128-wide step after another: fanning each out to threads costs more than it saves
            hidden, state = self.lstm(features.unsqueeze(0), state)
        out = self.final_conv(F.relu(hidden[0]).unsqueeze(-1))
        return torch.sigmoid(out).flatten(), state

    def stream_many(
        self, frames: list[Tensor], states: list[tuple[Tensor, Tensor] | None]
    ) -> tuple[list[Tensor], list[tuple[Tensor, Tensor]]]:
        """stream() for several streams at once, each continuing from its own LSTM state: one pass of the front
        end over every stream's frames and one LSTM call over the streams side by side, so that many live
        streams cost about what one does (each call has a fixed cost far above its arithmetic)."""
        counts = [len(f) for f in frames]
        features = self.encode(torch.cat(frames)).split(counts)
        zeros = torch.zeros(1, 128)
        h0 = torch.stack([s[0][:, 0] if s is not None else zeros for s in states], dim=1)
        c0 = torch.stack([s[1][:, 0] if s is not None else zeros for s in states], dim=1)
        packed = nn.utils.rnn.pack_sequence(list(features), enforce_sorted=False)
        with _one_thread():
            hidden, (h, c) = self.lstm(packed, (h0, c0))
        hidden, _ = nn.utils.rnn.pad_packed_sequence(hidden, batch_first=True)  # (streams, max frames, 128)
        out = torch.sigmoid(self.final_conv(F.relu(hidden).transpose(1, 2))).squeeze(1)  # (streams, max frames)
        probs = [out[i, :n] for i, n in enumerate(counts)]
        return probs, [(h[:, i : i + 1].clone(), c[:, i : i + 1].clone()) for i in range(len(frames))]


def frame_audio(audio: Tensor) -> Tensor:
    """Cut 16 kHz audio into silero's frames, each led by the previous frame's tail (zeros before the first).

    Returns frames : Tensor, shape = (ceil(samples / FRAME_SAMPLES), CONTEXT_SAMPLES + FRAME_SAMPLES)
    """
    num_frames = -(-audio.shape[-1] // FRAME_SAMPLES)
    padded = F.pad(audio, (CONTEXT_SAMPLES, num_frames * FRAME_SAMPLES - audio.shape[-1]))
    return padded.unfold(0, CONTEXT_SAMPLES + FRAME_SAMPLES, FRAME_SAMPLES)


class VoiceActivityDetector:
    """Speech spans of whole recordings; the model is loaded once, on first use, and runs on the CPU."""

    def __init__(self) -> None:
        self._model: SileroVAD | None = None
        self._lock = threading.Lock()

    @property
    def model(self) -> SileroVAD:
        with self._lock:
            if self._model is None:
                self._model = SileroVAD.from_package()
        return self._model

    def start(self) -> None:
        """Silero loaded now (else on first use)."""
        self.model  # noqa: B018

    def close(self) -> None:
        """Nothing to stop: the model lives as long as this object (SpeechStreamsProcess's interface)."""

    @torch.inference_mode()
    def speech_probs(self, audio: np.ndarray) -> list[float]:
        """One probability per 32 ms frame of 16 kHz mono audio."""
        if len(audio) == 0:
            return []
        frames = frame_audio(torch.as_tensor(audio, dtype=torch.float32).cpu())
        return self.model(frames).tolist()

    def stream(self) -> SpeechStream:
        """Probabilities of a live stream, frame by frame as its audio arrives (realtime turn detection)."""
        return SpeechStream(self.model)

    @staticmethod
    def push_many(streams: list[SpeechStream], audio: list[np.ndarray]) -> list[list[float]]:
        """Several streams' push() in one pass (push_many)."""
        return push_many(streams, audio)

    def speech_spans(
        self, audio: np.ndarray, options: ChunkingOptions, max_span_s: float = float("inf")
    ) -> list[tuple[int, int]]:
        """(start, end) sample ranges of speech, padded by `prefix_padding_ms`, split at pauses of at least
        `silence_duration_ms`; a span longer than `max_span_s` is cut at its longest pause."""
        probs = self.speech_probs(audio)
        if not probs:
            return []
        spans = _import_silero().get_speech_timestamps_from_probs(
            probs,
            sampling_rate=SAMPLE_RATE,
            threshold=options.threshold,
            min_speech_duration_ms=MIN_SPEECH_MS,
            max_speech_duration_s=max_span_s,
            min_silence_duration_ms=options.silence_duration_ms,
            speech_pad_ms=options.prefix_padding_ms,
            audio_length_samples=len(audio),
        )
        return [(int(s["start"]), int(s["end"])) for s in spans if s["end"] > s["start"]]


class SpeechStream:
    """Silero over audio that arrives in pieces: push() returns the probabilities of the 32 ms frames the new
    samples complete, each frame led by the previous one's tail and the LSTM carried over, as frame_audio and
    one forward pass over the whole stream would have it."""

    def __init__(self, model: SileroVAD):
        self.model = model
        self.tail = torch.zeros(CONTEXT_SAMPLES)
        self.pending = torch.zeros(0)
        self.state: tuple[Tensor, Tensor] | None = None
        self.frames_done = 0

    @torch.inference_mode()
    def push(self, audio: np.ndarray) -> list[float]:
        frames = self.frames(audio)
        if frames is None:
            return []
        probs, self.state = self.model.stream(frames, self.state)
        return probs.tolist()

    def frames(self, audio: np.ndarray) -> Tensor | None:
        """The frames that `audio` completes (None for none); the stream's position moves past them."""
        samples = torch.cat([self.pending, torch.as_tensor(audio, dtype=torch.float32)])
        n = samples.shape[0] // FRAME_SAMPLES
        if n == 0:
            self.pending = samples
            return None
        whole = torch.cat([self.tail, samples[: n * FRAME_SAMPLES]])
        self.tail = samples[n * FRAME_SAMPLES - CONTEXT_SAMPLES : n * FRAME_SAMPLES].clone()
        self.pending = samples[n * FRAME_SAMPLES :].clone()
        self.frames_done += n
        return whole.unfold(0, CONTEXT_SAMPLES + FRAME_SAMPLES, FRAME_SAMPLES)


@torch.inference_mode()
def push_many(streams: list[SpeechStream], audio: list[np.ndarray]) -> list[list[float]]:
    """SpeechStream.push for several streams (of one model) in one pass: what each returns is what its own push
    would have (tests/unit/test_vad.py)."""
    frames = [stream.frames(a) for stream, a in zip(streams, audio)]
    busy = [i for i, f in enumerate(frames) if f is not None]
    out: list[list[float]] = [[] for _ in streams]
    if not busy:
        return out
    probs, states = streams[0].model.stream_many([frames[i] for i in busy], [streams[i].state for i in busy])
    for i, p, state in zip(busy, probs, states):
        streams[i].state = state
        out[i] = p.tolist()
    return out


@contextlib.contextmanager
def _one_thread():
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(num_threads)


def _import_silero():
    """The silero_vad package, imported without its side effect on the process."""
    num_threads = torch.get_num_threads()
    import silero_vad  # its import calls torch.set_num_threads(1), which would slow the engine down

    torch.set_num_threads(num_threads)
    return silero_vad
