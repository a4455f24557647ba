"""Consumers for the inputs tests: steps that compute from their dependencies' results."""

from tidemq import Message, mq_consumer


@mq_consumer("inputs.step", threads=2, ttr=10)
def step(message: Message):
    # A chain's first step starts from its data; every later one from the previous result.
    return message.input + 1 if message.depends_on else message.data


@mq_consumer("inputs.member", threads=4, ttr=10)
def member(message: Message):
    return message.data * 10


@mq_consumer("inputs.callback", threads=2, ttr=10)
def callback(message: Message):
    return {"inputs": message.inputs, "statuses": [o.status.value for o in message.outcomes]}


@mq_consumer("inputs.async_callback", ttr=10)
async def async_callback(message: Message):
    return {"inputs": await message.ainputs(), "depends_on": list(message.depends_on)}
