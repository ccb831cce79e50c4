"""The models a gateway serves: public names and aliases -> each model's ordered targets.

Built once from the :class:`~gateway.config.Config` (models do not change on a policy
reload). The endpoint resolves the requested model once into the request's
``RequestContext.route``; a stage that chooses another model to serve (route, admission's
reroute) resolves that one; the stages that need a model's targets (compress, admission)
and dispatch read the context's route.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Config, Target
from gateway.errors import ModelNotFound

__all__ = ["ModelRoute", "ModelTable", "model_not_found"]


def model_not_found(name: str) -> ModelNotFound:
    """The 404 (``param: model``) for a model name the gateway does not serve."""
    return ModelNotFound(f"the model '{name}' does not exist on this gateway; "
                         "GET /v1/models lists the available models", param="model")


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A public model (``name``, its aliases resolved) and its ordered ``targets``."""

    name: str
    targets: tuple[Target, ...]


class ModelTable:
    """Public model names and aliases -> the model's ordered targets."""

    def __init__(self, config: Config):
        self.routes: dict[str, ModelRoute] = {}
        self.names: list[str] = []
        for name, model in config.models.items():
            route = ModelRoute(name, model.targets)
            self.names.append(name)
            for public in (name, *model.aliases):
                self.routes[public] = route

    def resolve(self, name: str) -> ModelRoute:
        """Raises ModelNotFound (404, ``param: model``) for a name the config does not
        list."""
        route = self.routes.get(name)
        if route is None:
            raise model_not_found(name)
        return route
