"""The equivalence harness (issue 27): every default-on stage keeps what a request means.

Requests built from ../shared/data (:mod:`.corpus`), a small built-in corpus
(:mod:`.builtin`) and fuzzed bodies (:mod:`.fuzz`) go through a running gateway, under the
default policy and under one with every stage on (:mod:`.harness`), to recording fake
upstreams of the same API. The runner (:mod:`.runner`) holds what each upstream received
against the contract (:mod:`.contract`: what may differ from what the client sent, and
nothing else; its rules in :mod:`.rules`, :mod:`.openai_rules`, :mod:`.anthropic_rules`,
:mod:`.relocation`, :mod:`.compressed`, read with the test's own :mod:`.lines` and
:mod:`.evidence`) and names, for a failure, the request and the first difference
(:mod:`.diff`).
"""
