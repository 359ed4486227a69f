"""The model, one module per concern:

- ``stage1``: ``Stage1Model`` (a wav2vec2 speech encoder and a BERT text encoder in one
  contrastive space), how it is built, and its contrastive loss;
- ``attention``: the SDPA backend kinds of ``speech_attention`` / ``text_attention``
  (``sdpa_cudnn``, ``sdpa_flash``, ``sdpa_efficient``, ``sdpa_math``) and their build-time
  probe;
- ``pretrained``: local pretrained checkpoints, read offline (no torch);
- ``export``: a trained model written as ``save_pretrained`` folders, and read back.

Nothing is re-exported here (``pretrained`` is the driver's, without torch): import the module
that owns a name.
"""

__all__: list[str] = []
