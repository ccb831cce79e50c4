"""Offline tools: replay, the semantic cache's calibration and verifier training, the
router's evaluation and training, and the on-disk embedding memo they share.

Never imported at serve time: ``gateway serve`` loads none of these modules, and their heavy
dependencies (scikit-learn, rich, the ``openai`` SDK) come with the ``tools`` extra
(``pip install 'llm-gateway[tools]'``). ``gateway replay|cache|route`` import the one they
run when the command line names it (see :mod:`gateway.cli`).
"""
