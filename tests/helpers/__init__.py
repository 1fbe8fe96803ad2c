"""Helpers shared by the tests (and by benchmarks/http_load.py, soak.py and realtime_sessions.py), imported one way:
`from tests.helpers.<module> import ...`. Fixtures stay in the conftest.py files.

- engine_runs: running the Engine in tests (submit_all, settled_steps, tokens_of, scores, GREEDY, WAIT_S) and
  faster-whisper as the reference (faster_whisper_model, faster_whisper_transcribe, Reference, TranscriptCache,
  first_difference).
- fake_engine: FakeEngine, a stand-in for the Engine so that route tests run without weights, with clients() and
  wav_bytes() (unit tests only).
- hostile_media: uploads that point FFmpeg beyond their own bytes (SDP, HLS, DASH, ffconcat), a TCP listener for
  them to point at, and the UDP sockets a process holds.
- lora: real PEFT LoRA adapters made with peft (trained_adapter, random_adapter) and the model with one merged into
  its weights (merged_model), cached under $WHISPER_TEST_CACHE.
- realtime: a clip as a realtime client streams it (24 kHz PCM, 100 ms base64 chunks) and as a WAV for HTTP
  (also benchmarks/realtime_sessions.py).
- server: RemoteServer, a real `python -m server serve` on 127.0.0.1 (args, env, port, /health wait, log, stop;
  a context manager), free_port, REPO, and what tests read from or do to a running server (metric, abandon, its
  memory: tree_rss_mib, gpu_memory_mib).
- transcripts: the JFK clip and its words, loose word matching (words, contains_words, COMMON_ENGLISH) and the
  WER normalizers (normalize_text, normalize_english).
- weights_export: a loaded Checkpoint written back out as a Hugging Face directory or an OpenAI .pt file.
"""
