"""The Python client of rlvrd's HTTP API (standard library only; tqdm, when installed, draws
`watch`'s bar).

    import rlvr
    client = rlvr.Client(server="http://127.0.0.1:8470", token="...")
    job = client.submit("job.toml")          # or a dict, or an rlvr.SpecBuilder
    job = client.wait(job.id)                # follows its events to its end
    print(job.state, job.gates and job.gates.passed)
"""

__version__ = "0.1.0"

from .client import DEFAULT_SERVER, Client  # noqa: E402
from .download import verify_files  # noqa: E402
from .errors import (  # noqa: E402
    ApiError,
    BadAnswer,
    Conflict,
    FieldProblem,
    Forbidden,
    IntegrityError,
    Invalid,
    NotFound,
    RateLimited,
    RlvrError,
    ServerError,
    SpecError,
    TooLarge,
    Unauthorized,
    Unreachable,
)
from .models import (  # noqa: E402
    TERMINAL_STATES,
    Criterion,
    Dataset,
    GateReport,
    Job,
    JobEvent,
    JobLog,
    JobOutput,
    JobPage,
    LineVersion,
    Manifest,
    MetricsLine,
    ModelLine,
    Outcome,
    Plugin,
    PluginList,
    Progress,
    VerifyResult,
)
from .spec import SpecBuilder, read_spec_file  # noqa: E402

__all__ = [
    "Client", "DEFAULT_SERVER", "SpecBuilder", "read_spec_file", "verify_files",
    "RlvrError", "ApiError", "Invalid", "Unauthorized", "Forbidden", "NotFound", "Conflict",
    "TooLarge", "RateLimited", "ServerError", "Unreachable", "BadAnswer", "SpecError",
    "IntegrityError", "FieldProblem",
    "Job", "JobEvent", "JobPage", "JobLog", "GateReport", "Criterion", "MetricsLine", "Dataset",
    "ModelLine", "Manifest", "Plugin", "PluginList", "VerifyResult", "TERMINAL_STATES", "Progress",
    "Outcome", "LineVersion", "JobOutput",
]
