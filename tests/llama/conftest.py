"""A real model for turnlog's providers: one llama-server (SmolLM2-135M, two slots of 2,048
tokens of context each) shared by the tests that do not stop it, a second one for tool calls
(the model's own chat template has none: see `scripts/llama`), and one turnlog whose agents
reach them through the OpenAI provider (Chat Completions, `/v1`) and through the Anthropic
provider (Messages, `/v1/messages`). Each agent comes in several sizes: `<provider>` answers
in a sentence, `_tiny` stops at 3 tokens, `_long` may say 1,500, and `_tools` must call a
tool (`tool_choice = "required"`)."""

import pathlib
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from llama import ALIAS, Llama  # noqa: E402
from turnlog_server import Server  # noqa: E402

PROVIDERS = ["openai", "anthropic"]
SYSTEM = "You are a helpful assistant."


def agents(llama_url: str, tools_url: str | None = None, **model_extra) -> str:
    """Config: the agents of both providers at the llama-server at `llama_url` (`_tools` at
    `tools_url`)."""
    extra = "".join(f", {key} = {value}" for key, value in model_extra.items())
    out = ""
    sizes = [("", ", max_tokens = 48"), ("_tiny", ", max_tokens = 3"), ("_long", ", max_tokens = 1500"),
             ("_tools", ', max_tokens = 128, tool_choice = "required"')]
    for provider in PROVIDERS:
        for suffix, more in sizes:
            url = tools_url if suffix == "_tools" and tools_url else llama_url
            base = f"{url}/v1" if provider == "openai" else url
            model = f'provider = "{provider}", base_url = "{base}", name = "{ALIAS}", temperature = 0{extra}{more}'
            out += f'\n[agents.{provider}{suffix}]\nsystem = "{SYSTEM}"\nmodel = {{ {model} }}\n'
    return out


@pytest.fixture(scope="session")
def llama():
    with tempfile.TemporaryDirectory() as root:
        server = Llama(pathlib.Path(root) / "llama.log")
        yield server
        server.stop()


@pytest.fixture(scope="session")
def llama_tools():
    with tempfile.TemporaryDirectory() as root:
        server = Llama(pathlib.Path(root) / "llama.log", slots=1, context=2048, tool_calls=True)
        yield server
        server.stop()


@pytest.fixture(scope="session")
def turnlog(llama, llama_tools):
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, agents(llama.url, llama_tools.url))
        yield running.url
        running.stop()


@pytest.fixture(params=PROVIDERS)
def provider(request) -> str:
    return request.param
