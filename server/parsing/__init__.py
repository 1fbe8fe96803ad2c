"""Request bodies to validated parameters, one job per module:

- `body`: reading a body within its limits (forms with the SDK's bracketed fields flattened, bounded JSON), and
  pydantic validation as OpenAI's 400s;
- `fields`: each field's own checks (model, languages, response format, speakers, keywords, chunking);
- `audio`: uploaded bytes decoded to samples off the event loop, and the known speakers' references;
- `options`: a transcription request from its body to its parameters, and the engine's DecodeOptions.
"""
