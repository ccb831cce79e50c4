"""Test and benchmark helpers shipped with the gateway: a fake OpenAI upstream and a
threaded uvicorn runner. Nothing here is used on the serving path."""
