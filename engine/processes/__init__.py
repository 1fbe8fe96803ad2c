"""Engines beyond one loop thread: an engine in a child process, and several behind one interface.

- `engine_process.py`: `EngineProcess`, the engine in a child process (one GPU each), behind the same protocol;
  `EngineClient`, another process's connection to it (the server's further front-ends)
- `pool.py`: `EnginePool`, data parallel engines behind one engine's interface (least load first; a request no
  engine had started moves to a live one when its engine dies)
- `child.py`: what every child process of the engine's takes from its parent (logging, switch interval, name); it
  imports nothing of the engine, so any layer's child process may use it (the diarizer's, Silero's)

May import engine.runtime and the modules at engine's top level.
"""
