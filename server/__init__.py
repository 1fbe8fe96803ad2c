"""OpenAI-compatible HTTP server around `engine` (FastAPI + uvicorn)."""
