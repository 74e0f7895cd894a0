"""A two-turn arithmetic environment on OpenEnv 0.10.0: the model answers `a+b=`; a wrong first
answer gets the sum back as feedback and one more try; a right answer ends the episode with reward 1.

The environment's reply is what makes the second turn winnable: trained single-turn, a model gets
one try and no feedback; trained on this environment, it can learn to use the reply.

    python arith_feedback.py --port 8000 [--max-concurrent-envs 64] [--step-delay-s 0] [--pad]
    python arith_feedback.py --uds PATH ...     # on a Unix socket: as a job's sidecar

`--pad` writes operands with two digits (`07+31=`), as `rlvrd data arith --pad` does.

`reset` takes the data row's `a` and `b` (integers); an action is `{"answer": "..."}`. Runs on the
venv `scripts/openenv-venv.sh` makes.
"""

import argparse
import time
import uuid

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

TRIES = 2


class ArithAction(Action):
    answer: str = Field(description="The model's answer: the sum, digits only")


class ArithObservation(Observation):
    text: str = Field(default="", description="What the model reads next")


class ArithState(State):
    a: int = 0
    b: int = 0
    tries: int = 0


class ArithFeedback(Environment[ArithAction, ArithObservation, ArithState]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    step_delay_s = 0.0
    pad = False

    def __init__(self):
        super().__init__()
        self._state = ArithState(episode_id=str(uuid.uuid4()))

    def reset(self, seed=None, episode_id=None, a: int = 0, b: int = 0, **kwargs):
        self._state = ArithState(episode_id=episode_id or str(uuid.uuid4()), a=int(a), b=int(b))
        return ArithObservation(text=self.problem(), done=False, reward=0.0)

    def problem(self):
        a, b = self._state.a, self._state.b
        return f"{a:02d}+{b:02d}=" if self.pad else f"{a}+{b}="

    def step(self, action, timeout_s=None, **kwargs):
        time.sleep(self.step_delay_s)
        state = self._state
        state.tries += 1
        state.step_count += 1
        right = action.answer.strip() == str(state.a + state.b)
        if right:
            return ArithObservation(text="", done=True, reward=1.0)
        if state.tries >= TRIES:
            return ArithObservation(text="", done=True, reward=0.0)
        total = state.a + state.b
        return ArithObservation(text=f" no:{total} {self.problem()}", done=False, reward=0.0)

    @property
    def state(self):
        return self._state


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument("--uds", help="serve on this Unix socket instead (a job's sidecar)")
    parser.add_argument("--max-concurrent-envs", type=int, default=64)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    parser.add_argument("--pad", action="store_true", help="operands with two digits (07+31=)")
    args = parser.parse_args()
    ArithFeedback.step_delay_s = args.step_delay_s
    ArithFeedback.pad = args.pad
    app = create_app(
        ArithFeedback,
        ArithAction,
        ArithObservation,
        env_name="arith_feedback",
        max_concurrent_envs=args.max_concurrent_envs,
        state_cls=ArithState,
    )
    if args.uds:
        uvicorn.run(app, uds=args.uds, log_level="warning")
    else:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
