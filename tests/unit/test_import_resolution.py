"""The allow-list judges what an import path resolves to, not only the module it names (issue 27, defect 2).

``STREAMSERVE_IMPORT_ALLOW=examples`` used to load ``examples.echo:os.system``: the module is under the prefix,
but the path walks into a module it imported. The replica's loader now checks every object along the path.
"""

from __future__ import annotations

import os

import pytest

from streamserve.control.security import ImportAllowList
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import ConfigError
from streamserve.workers.loader import import_attr, load
from tests import allow_list_targets
from tests.allow_list_targets import Model

TARGETS = "tests.allow_list_targets"
ALLOW = ImportAllowList((TARGETS,))


def resolve(attr_path: str, allow: ImportAllowList = ALLOW) -> object:
    return import_attr(f"{TARGETS}:{attr_path}", allow, "d")


@pytest.mark.parametrize(
    ("attr_path", "reason"),
    [
        ("os.system", f"'{TARGETS}:os' is the module 'os' from module 'os'"),  # stops at os: never reads .system
        ("os.no_such_thing", f"'{TARGETS}:os' is the module 'os'"),
        ("system", f"'{TARGETS}:system' is the function 'system' from module 'posix'"),
        ("print", f"'{TARGETS}:print' is the function 'print' from module 'builtins'"),
        ("__builtins__", f"'{TARGETS}:__builtins__' is an instance of 'dict' from module 'builtins'"),
        ("run_true", f"'{TARGETS}:run_true' is an instance of 'partial' from module 'functools'"),
        ("table", "an instance of 'dict' from module 'builtins'"),
        ("handler.__globals__", f"'{TARGETS}:handler.__globals__' is an instance of 'dict'"),
        ("Model.__class__", f"'{TARGETS}:Model.__class__' is the class 'type' from module 'builtins'"),
        ("Model.mro", f"'{TARGETS}:Model.mro' is the function 'Model.mro' from no module (a builtin)"),
        ("model.__dict__", "is an instance of 'dict' from module 'builtins'"),
    ],
)
def test_an_object_from_outside_the_allow_list_is_refused_wherever_it_is_reached(attr_path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve(attr_path)
    message = str(refused.value)
    assert message.startswith(f"deployment 'd': import_path '{TARGETS}:{attr_path}' is refused: ")
    assert reason in message
    assert f"outside STREAMSERVE_IMPORT_ALLOW ({TARGETS})" in message


def test_the_attack_of_the_issue_is_refused() -> None:
    cfg = DeploymentConfig.model_validate({"name": "pwn", "import_path": "examples.echo:os.system"})
    with pytest.raises(ConfigError) as refused:
        load(cfg, ImportAllowList.parse("examples"))
    assert str(refused.value) == (
        "deployment 'pwn': import_path 'examples.echo:os.system' is refused: 'examples.echo:os' is the module 'os' "
        "from module 'os', outside STREAMSERVE_IMPORT_ALLOW (examples); name a function or class defined in an "
        "allowed module"
    )


@pytest.mark.parametrize(
    ("attr_path", "expected"),
    [
        ("handler", allow_list_targets.handler),
        ("Model", Model),
        ("Model.Options", Model.Options),  # a class nested in an allowed class
        ("Model.helper", Model.helper),  # a static method
        ("Model.predict", Model.predict),
        ("model", allow_list_targets.model),  # an instance: its class is defined in an allowed module
    ],
)
def test_what_an_allowed_module_defines_is_allowed(attr_path: str, expected: object) -> None:
    assert resolve(attr_path) is expected


def test_a_bound_method_of_an_allowed_instance_is_allowed() -> None:
    assert resolve("model.predict") == allow_list_targets.model.predict


def test_a_class_from_an_allowed_module_loads_as_before() -> None:
    cfg = DeploymentConfig.model_validate({"name": "m", "import_path": f"{TARGETS}:Model.Options", "init_args": [1]})
    loaded = load(cfg, ALLOW)
    assert loaded.is_class and isinstance(loaded.target, Model.Options) and loaded.target.body == 1


def test_the_module_named_is_still_checked_first() -> None:
    cfg = DeploymentConfig.model_validate({"name": "pwn", "import_path": "os:system"})
    with pytest.raises(ConfigError, match=r"^deployment 'pwn': import_path 'os:system' is outside"):
        load(cfg, ALLOW)


def test_builtins_are_refused_even_when_listed() -> None:
    allow = ImportAllowList.parse(f"builtins, {TARGETS}")
    assert not allow.allows("builtins:eval")
    with pytest.raises(ConfigError, match="from module 'builtins'"):
        resolve("print", allow)


def test_without_an_allow_list_every_path_resolves_as_before() -> None:
    assert resolve("os.system", ImportAllowList()) is os.system
    assert resolve("print", ImportAllowList()) is print


def test_a_module_not_found_says_where_it_was_looked_for() -> None:
    """A farm run from a directory that does not hold the package (outside the repository, for the examples) said
    only "No module named 'examples'"."""
    with pytest.raises(ConfigError) as missing:
        import_attr("no_such_package.mod:f", ImportAllowList(), "d")
    assert str(missing.value) == (
        "cannot import module 'no_such_package.mod': No module named 'no_such_package' "
        f"(looked for from {os.getcwd()}, where this replica runs, and the installed packages)"
    )


def test_a_misspelt_attribute_names_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=r"has no attribute 'Modle' \(did you mean 'Model'\?\)"):
        resolve("Modle", ImportAllowList())
    with pytest.raises(ConfigError, match=r"has no attribute 'Model.predictt' \(did you mean 'Model.predict'\?\)"):
        resolve("Model.predictt", ImportAllowList())


def test_a_function_that_cannot_take_a_body_is_refused_at_load_not_at_every_call() -> None:
    """`def f():` loaded, and each call was a 500 TypeError (found by an outside tester)."""
    cfg = DeploymentConfig(name="d", import_path=f"{TARGETS}:no_body")
    with pytest.raises(ConfigError, match=r"no_body cannot take a request's body as its one argument"):
        load(cfg, ImportAllowList())
    assert load(DeploymentConfig(name="d", import_path=f"{TARGETS}:handler"), ImportAllowList()).target(1) == 1
    # A decorated function is called as its wrapper takes it (a decorator that supplies an argument was refused).
    decorated = load(DeploymentConfig(name="d", import_path=f"{TARGETS}:with_db_handler"), ImportAllowList())
    assert decorated.target(1) == [1, "db"]


def test_something_not_callable_is_named_by_its_type() -> None:
    with pytest.raises(ConfigError, match=r"table is not a function or class: its type is dict"):
        load(DeploymentConfig(name="d", import_path=f"{TARGETS}:table"), ImportAllowList())
