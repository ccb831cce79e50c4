"""Wire-level pieces that the gateway and the local engine both speak.

Neither package imports the other for these: both import this one (dependencies point one
way, ``gateway -> llm_wire <- local_engine``). Pure helpers, no state.
"""
