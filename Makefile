# labctl: the commands a newcomer needs. `make demo` runs labctl on a simulated lab,
# `make test` runs everything CI runs. Both set up the virtualenv themselves.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
SIM_DIR := .labctl/sim
SIM_INV := $(SIM_DIR)/inventory.yaml

.PHONY: install deps lint test test-unit test-integration llama-server demo bench gpu-check gpu-wheels sim-down clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch,hf,plot,tensorboard,cloud]'
	touch $@

# System packages the tests need (Debian/Ubuntu, as root): the simulated lab, Docker sandboxes, netplan's
# parser, tmux (status --watch), Prometheus and node_exporter (they read what `labctl metrics` writes),
# Slurm and munge (a one-node cluster runs the sbatch scripts `train --backend slurm` writes).
deps:
	@{ command -v sshd >/dev/null 2>&1 || test -x /usr/sbin/sshd; } && test -x /usr/sbin/cron && test -x /usr/sbin/dockerd && test -x /usr/sbin/debootstrap \
		&& test -x /usr/sbin/netplan && command -v tmux >/dev/null && command -v prometheus >/dev/null && command -v prometheus-node-exporter >/dev/null && test -x /usr/sbin/slurmctld && test -x /usr/sbin/munged \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client iproute2 iptables cron \
			docker.io debootstrap netplan.io tmux prometheus prometheus-node-exporter slurm-wlm munge; }

lint: install
	$(BIN)/ruff check labctl tests bench
	$(BIN)/ruff format --check labctl tests bench
	$(BIN)/mypy labctl

# Both halves run on two workers (pytest-xdist). The unit tests share nothing but the CPU. In the
# integration half each worker brings up a simulated lab of its own; what the labs do not separate
# is a group run on one worker: this machine's Docker and `connection: local` state (ON_THIS_MACHINE
# in tests/conftest.py), and its Slurm (ON_SLURM). Every other module is a group of its own. The
# groups go out in file order (--no-loadscope-reorder), so each lab sees its modules in the order
# of a run without workers.
test: install deps
	$(BIN)/pytest -q -rs --durations=15 -n 2 -m "not integration" tests
	$(MAKE) llama-server
	$(BIN)/pytest -q -rs --durations=40 -n 2 --dist loadgroup --no-loadscope-reorder -m integration tests

# llama.cpp's llama-server, CPU-only, from pinned sources (the llama-cpp-python source package from
# PyPI), built once into ~/.cache/labctl-tests and reused: the integration tests serve GGUF models
# with it. The first build takes about 10 minutes on 2 cores; later runs find it in a second.
llama-server: install
	@command -v cmake >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++; }
	$(BIN)/python -m tests.llama_cpp_build

test-unit: install
	$(BIN)/pytest -q -rs -n 2 -m "not integration" tests

# A model small enough for two simulated hosts sharing this machine's CPUs.
DEMO_TRAIN = --set steps=60 --set batch_size_per_gpu=8 --set seq_len=64 --set model.d_model=64 \
	--set model.n_layers=2 --set model.n_heads=4 --set model.d_ff=256 --set lr=3e-3 --set warmup_steps=5 \
	--set log_every=10 --set checkpoint_every=20 --set checkpoint_dir=/var/lib/labctl/train/demo-phase1

DEMO_ORCH = inventory/examples/orchestra-sim.yaml
# Phase 3's loop, short: 3 steps, one task each (the first three, which demo-coder was trained on),
# answers of up to 64 tokens (a solution's length): the cpu-demo profile (`labctl train settings`).
DEMO_P3 = --profile cpu-demo --set steps=3 --set checkpoint_every=100 \
	--set checkpoint_dir=/var/lib/labctl/train/demo-phase3

demo: install deps
	$(BIN)/labctl sim up
	$(BIN)/labctl -i $(SIM_INV) inventory show
	$(BIN)/labctl -i $(SIM_INV) facts
	$(BIN)/labctl -i $(SIM_INV) exec -- 'hostname -I; cat /proc/loadavg'
	@echo "== provision: what would change (nothing is changed) =="
	$(BIN)/labctl -i $(SIM_INV) provision --check --diff
	@echo "== provision for real (torch_env left out: the sim cannot reach download.pytorch.org) =="
	$(BIN)/labctl -i $(SIM_INV) provision --skip-tags torch
	@echo "== provision again: nothing left to change =="
	$(BIN)/labctl -i $(SIM_INV) provision --skip-tags torch
	@echo "== a 0.5 GB model on the storage host, synced host to host into m5's RAM cache, then every load stage =="
	$(BIN)/labctl -i $(SIM_INV) bench make-model --size-gb 0.5 --host irina --name tinylm-demo
	$(BIN)/labctl -i $(SIM_INV) cache sync tinylm-demo --host m5
	$(BIN)/labctl -i $(SIM_INV) cache status
	@# The sim's hosts share this machine's disk: the controller's venv stands in for m5's torch_env.
	$(BIN)/labctl -i $(SIM_INV) bench model-load --host m5 --model tinylm-demo --python $(CURDIR)/$(BIN)/python --plot $(SIM_DIR)/model-load.png
	@echo "== the network: TCP host to host over the sim's 1 Gbit links, one and two streams =="
	$(BIN)/labctl -i $(SIM_INV) bench network --from irina --to m5 --streams 1,2 --seconds 3
	@echo "== bonding m5: the preflight refuses (this kernel has no bonding driver) and changes nothing =="
	-$(BIN)/labctl -i $(SIM_INV) provision -p playbooks/network.yaml --check --diff --limit m5
	@echo "== a change that cuts labctl off (pharaoh's eth0 to another subnet): the host undoes it by itself =="
	-$(BIN)/labctl -i $(SIM_INV) exec -l pharaoh --network --revert-after 10 -- 'ip addr flush dev eth0 && ip addr add 10.99.0.5/24 dev eth0'
	$(BIN)/labctl -i $(SIM_INV) exec -l pharaoh -- 'ip -br addr show dev eth0'
	@echo "== training, phase 1: the preflight refuses m5 (it declares a V100; the sim has no GPU and a CPU torch) =="
	-$(BIN)/labctl -i $(SIM_INV) train --phase 1 --check --python $(CURDIR)/$(BIN)/python
	@echo "== training, phase 1 on m5 + irina as CPU processes (gloo), a small model, checkpoints every 20 steps =="
	@# A fresh start each time: a re-run with the same checkpoint_dir would resume at its last step.
	$(BIN)/labctl -i $(SIM_INV) exec -l m5,irina -- rm -rf /var/lib/labctl/train/demo-phase1
	$(BIN)/labctl -i $(SIM_INV) train --phase 1 --limit m5,irina --device cpu --python $(CURDIR)/$(BIN)/python $(DEMO_TRAIN)
	$(BIN)/labctl -i $(SIM_INV) train status
	@echo "== the same run for a Kubernetes cluster: a Kubeflow Trainer v2 TrainJob, checkpoints on a ReadWriteMany claim (written, not applied) =="
	$(BIN)/labctl -i $(SIM_INV) train --phase 1 --limit m5,irina --device cpu --python $(CURDIR)/$(BIN)/python $(DEMO_TRAIN) \
		--backend trainjob --pvc cet-ckpt --mount-path /var/lib/labctl/train -o $(SIM_DIR)/jobs
	@echo "== checkpoints off the training host: each run's newest into irina's library (host to host), listed, re-hashed =="
	$(BIN)/labctl -i $(SIM_INV) ckpt backup
	$(BIN)/labctl -i $(SIM_INV) ckpt list
	$(BIN)/labctl -i $(SIM_INV) ckpt verify
	@echo "== the week over free cloud GPUs (Kaggle's and SageMaker's free quotas), with a Gantt chart =="
	$(BIN)/labctl -i $(SIM_INV) plan week --plot $(SIM_DIR)/week.png
	@echo "== the LLM orchestra: 3 of 5 small models kept warm on m5 (CPU servers; demo-coder a Hugging Face Llama served through transformers), one rotation, phase 3's check =="
	for m in demo-a demo-b demo-c demo-d; do $(BIN)/labctl -i $(SIM_INV) bench make-model --size-gb 0.05 --host irina --name $$m; done
	@# demo-coder: a tiny Llama trained here, on irina's CPU (about 15 s), to solve 8 phase-3 tasks.
	$(BIN)/labctl -i $(SIM_INV) bench make-model --kind coder --host irina --name demo-coder --python $(CURDIR)/$(BIN)/python
	$(BIN)/labctl -i $(SIM_INV) orchestra plan -f $(DEMO_ORCH)
	$(BIN)/labctl -i $(SIM_INV) orchestra start -f $(DEMO_ORCH) --python $(CURDIR)/$(BIN)/python
	$(BIN)/labctl -i $(SIM_INV) rotate -f $(DEMO_ORCH) --python $(CURDIR)/$(BIN)/python
	$(BIN)/labctl -i $(SIM_INV) orchestra status -f $(DEMO_ORCH)
	@echo "== phase 3's trainers ask the warm set at once over the OpenAI completions API (demo-coder writes code; the random models random text) =="
	$(BIN)/labctl -i $(SIM_INV) orchestra ask -f $(DEMO_ORCH) --task sum_two --max-tokens 64
	@echo "== phase 3 for real: m5 trains the CET, the warm set writes code from its contexts, irina's sandbox service runs it; demo-coder's programs pass (reward above 0) =="
	@# The sim's hosts share this machine's dockerd but cannot reach Debian's mirror: the image is built here.
	$(BIN)/labctl -i inventory/examples/local-sandbox.yaml provision -p inventory/examples/sandbox-python.yaml
	$(BIN)/labctl -i $(SIM_INV) sandbox serve
	$(BIN)/labctl -i $(SIM_INV) exec -l m5 -- rm -rf /var/lib/labctl/train/demo-phase3
	$(BIN)/labctl -i $(SIM_INV) train --phase 3 --limit m5 --device cpu --python $(CURDIR)/$(BIN)/python $(DEMO_P3)
	$(BIN)/labctl -i $(SIM_INV) bench rotation -f $(DEMO_ORCH) --python $(CURDIR)/$(BIN)/python
	@echo "== the lab at a glance (warm models, alerts), its checks before training and against the dev tier (the sim has no GPU: failures expected), its metrics for Prometheus =="
	$(BIN)/labctl -i $(SIM_INV) status
	-$(BIN)/labctl -i $(SIM_INV) doctor --tier dev
	$(BIN)/labctl -i $(SIM_INV) metrics --textfile $(SIM_DIR)
	@echo "Prometheus series written to $(SIM_DIR)/labctl.prom ($$(grep -c '^labctl_' $(SIM_DIR)/labctl.prom) samples)"
	@echo "The simulated lab is still up: try '$(BIN)/labctl -i $(SIM_INV) exec -- uname -a', then 'make sim-down'."

bench: install deps
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/exec_fanout.py --out docs/benchmarks.md
	$(BIN)/python bench/provision_nochange.py --out docs/benchmarks.md
	$(BIN)/python bench/loader_cpu.py --out docs/benchmarks.md
	$(BIN)/python bench/cache_sync.py --out docs/benchmarks.md
	$(BIN)/python bench/train_overhead.py
	$(BIN)/python bench/train_launch.py --out docs/benchmarks.md
	$(BIN)/python bench/network.py --out docs/benchmarks.md
	$(BIN)/python bench/orchestra_cycle.py --out docs/benchmarks.md
	$(BIN)/python bench/sandbox_service.py --out docs/benchmarks.md
	$(BIN)/python bench/network_txn.py --out docs/benchmarks.md
	$(BIN)/python bench/slurm_launch.py
	$(BIN)/python bench/test_call_costs.py --out docs/benchmarks.md

# Every GPU claim on a real card in one command (bench/gpu_check.py): JSON, tables and a log in
# $(GPU_OUT). Without a GPU it prints what it would check and exits 0. On a GPU machine with no
# network, first `make gpu-wheels` here and copy .whl/ along with the checkout.
GPU_OUT ?= .labctl/gpu-check
gpu-check:
	bash bench/gpu_check.sh $(GPU_OUT)

gpu-wheels: install
	$(BIN)/python bench/gpu_wheels.py

sim-down: install
	$(BIN)/labctl sim down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
