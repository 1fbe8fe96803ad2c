"""The loop that runs requests: from a submitted request's windows to decode steps on the device and back.

- `engine.py`: `Engine`, the inbox, the loop thread and `step()`: admit, launch, read, postprocess
- `request_table.py`: `RequestTable`, a request from arrival (log-mel) to its last event
- `scheduler.py`: waiting windows, admission to rows and cross slots, running sequences kept in rows `0..n-1`
- `sequence.py`: `WindowJob` (a window waiting for a slot, a plain record) and `Sequence` (one decoding row)
- `model_runner.py`: `ModelRunner`, weights, caches and graphs; a scheduled batch into tensors; encoder, prompt
  pass, decode steps, the logit rules and sampling (engine.decoding)
- `step_io.py`: a launch's inputs (from the host, or from the last launch's outputs still on the device) and its
  outputs on their way back
- `cuda_graphs.py`: `GraphRunner`, the encoder, decode steps, prompt passes and multi-step decoding captured and
  replayed

May import every folder below it (model, backends, kernels, decoding, audio, transcription); never processes or
the server.
"""
