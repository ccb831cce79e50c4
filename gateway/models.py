"""The models a gateway serves: public names and aliases -> each model's ordered targets.

Built once from the :class:`~gateway.config.Config` (models do not change on a policy
reload) and shared by the endpoints, the stages that need a model's targets (compress,
admission) and dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Config, Target
from gateway.errors import ModelNotFound

__all__ = ["ModelRoute", "ModelTable"]


@dataclass(frozen=True, slots=True)
class ModelRoute:
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
            raise ModelNotFound(f"the model '{name}' does not exist on this gateway; "
                                "GET /v1/models lists the available models", param="model")
        return route
