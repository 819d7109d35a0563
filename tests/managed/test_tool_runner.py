"""The SDK's own `tool_runner`: it opens the stream, lists the history and dedupes by id,
runs the session's custom tools as their calls come, and posts their results. turnlog's
durable log means it loses nothing: a call made before it started, or while it was cut off
by a server restart, is answered, and each exactly once."""

import asyncio

import anthropic
from anthropic.lib.tools import beta_async_tool

from conftest import ALICE, WEATHER, message


def weather_tool(ran: list):
    @beta_async_tool
    async def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"cold in {city}"

    return get_weather


def client(url: str):
    return anthropic.AsyncAnthropic(base_url=url, api_key=ALICE, max_retries=0, _strict_response_validation=True)


async def turns_ended(client, session_id: str, n: int):
    """Waits until `n` turns of the session have ended (not waiting for the client)."""
    for _ in range(1000):
        listed = [e async for e in client.beta.sessions.events.list(session_id, types=["session.status_idle"])]
        if sum(e.stop_reason.type == "end_turn" for e in listed) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {n} turns ended")


def test_the_tool_runner_answers_a_call_made_before_it_started(server, agent, environment):
    ran = []

    async def drive():
        sdk = client(server)
        session = await sdk.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        await sdk.beta.sessions.events.send(session.id, events=[message('/tool get_weather {"city": "Oslo"}')])
        for _ in range(500):
            if [e async for e in sdk.beta.sessions.events.list(session.id, types=["session.status_idle"])]:
                break
            await asyncio.sleep(0.01)
        calls = [c async for c in sdk.beta.sessions.events.tool_runner(session.id, tools=[weather_tool(ran)], max_idle=2)]
        return calls, [e async for e in sdk.beta.sessions.events.list(session.id)]

    calls, events = asyncio.run(drive())
    assert ran == ["Oslo"], "run once"
    assert [(c.name, c.posted, c.is_error) for c in calls] == [("get_weather", True, False)]
    results = [e for e in events if e.type == "user.custom_tool_result"]
    assert len(results) == 1 and results[0].content[0].text == "cold in Oslo"
    assert [e for e in events if e.type == "agent.message"][-1].content[0].text == "tool results: get_weather=cold in Oslo"
    assert events[-1].type == "session.status_idle" and events[-1].stop_reason.type == "end_turn"


def test_the_tool_runner_reconnects_across_a_restart_and_loses_nothing(own_server):
    ran = []

    async def drive():
        sdk = client(own_server.url)
        environment = await sdk.beta.environments.create(name="e")
        agent = await sdk.beta.agents.create(name="w", model="scripted", tools=[WEATHER])
        session = await sdk.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        runner = sdk.beta.sessions.events.tool_runner(session.id, tools=[weather_tool(ran)], max_idle=5)
        calls = []

        async def run():
            async for call in runner:
                calls.append(call)

        task = asyncio.create_task(run())
        await sdk.beta.sessions.events.send(session.id, events=[message('/tool get_weather {"city": "Oslo"}')])
        await turns_ended(sdk, session.id, 1)
        own_server.restart()  # the runner's stream is cut; it reconnects to the same address
        await sdk.beta.sessions.events.send(session.id, events=[message('/tool get_weather {"city": "Rome"}')])
        await turns_ended(sdk, session.id, 2)
        await asyncio.wait_for(task, timeout=60)
        return calls, [e async for e in sdk.beta.sessions.events.list(session.id)]

    calls, events = asyncio.run(drive())
    assert ran == ["Oslo", "Rome"], "each call run once"
    assert [c.posted for c in calls] == [True, True]
    results = [e.content[0].text for e in events if e.type == "user.custom_tool_result"]
    assert results == ["cold in Oslo", "cold in Rome"]


def test_the_tool_runner_stops_when_its_session_is_deleted(server, agent, environment):
    ran = []

    async def drive():
        sdk = client(server)
        session = await sdk.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        runner = sdk.beta.sessions.events.tool_runner(session.id, tools=[weather_tool(ran)], max_idle=600)

        async def run():
            return [call async for call in runner]

        task = asyncio.create_task(run())
        await sdk.beta.sessions.events.send(session.id, events=[message('/tool get_weather {"city": "Oslo"}')])
        await turns_ended(sdk, session.id, 1)
        await sdk.beta.sessions.delete(session.id)
        # It would wait ten minutes for more work; the end of the session's log ends it.
        return await asyncio.wait_for(task, timeout=30)

    calls = asyncio.run(drive())
    assert [c.name for c in calls] == ["get_weather"]
