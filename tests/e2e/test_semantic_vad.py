"""semantic_vad on a real server through the official `openai` SDK's realtime client: real speech with a 1.2 s
pause inserted mid-sentence ("Today only platforms one and ... three are used.") is one turn under semantic_vad,
whose end-of-turn model hears that the sentence goes on, and two under server_vad's 500 ms of silence."""

from __future__ import annotations

import numpy as np

from tests.helpers.paused_speech import RATE, paused_utterance
from tests.helpers.realtime import chunks, resample


def stream_turns(server, turn_detection: dict, pcm: bytes) -> tuple[dict, list, list]:
    """Stream `pcm` (24 kHz) under `turn_detection`: (the session's turn_detection as session.updated echoes it,
    the speech_stopped events, the completed transcripts in order)."""
    with server.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": turn_detection}}})
        updated = conn.recv()
        assert updated.type == "session.updated", updated
        for piece in chunks(pcm, 48):
            conn.input_audio_buffer.append(audio=piece)
        conn.input_audio_buffer.clear()  # its `cleared` comes once every append before it has been heard
        stopped, committed, completed, cleared = [], [], {}, False
        for ev in conn:
            if ev.type == "input_audio_buffer.speech_stopped":
                stopped.append(ev)
            elif ev.type == "input_audio_buffer.committed":
                committed.append(ev.item_id)
            elif ev.type == "conversation.item.input_audio_transcription.completed":
                completed[ev.item_id] = ev.transcript
            elif ev.type == "input_audio_buffer.cleared":
                cleared = True
            elif ev.type == "error":
                raise AssertionError(ev.error)
            if cleared and len(completed) == len(committed):
                break
    echoed = updated.session.audio.input.turn_detection.model_dump(exclude_none=True)
    return echoed, stopped, [completed[item] for item in committed]


def test_a_pause_mid_sentence_is_one_turn_under_semantic_vad_and_two_under_server_vad(server):
    audio, cut, _ = paused_utterance(pause_s=1.2)
    pcm = (np.clip(resample(audio, RATE, 24000), -1, 1) * 32767).round().astype("<i2").tobytes()
    echoed, stopped, transcripts = stream_turns(server, {"type": "semantic_vad", "eagerness": "auto"}, pcm)
    assert echoed == {"type": "semantic_vad", "eagerness": "auto"}
    assert len(stopped) == 1 and len(transcripts) == 1, transcripts
    assert stopped[0].audio_end_ms > cut * 1000 // RATE + 1200  # after the pause, not at it
    text = transcripts[0].lower()
    assert "platforms" in text and "used" in text, text
    _, stopped, transcripts = stream_turns(server, {"type": "server_vad", "silence_duration_ms": 500}, pcm)
    assert len(stopped) == 2 and len(transcripts) == 2, transcripts
    assert abs(stopped[0].audio_end_ms - cut * 1000 // RATE) < 150  # at the pause
    assert "platforms" in transcripts[0].lower() and "used" in transcripts[1].lower(), transcripts
