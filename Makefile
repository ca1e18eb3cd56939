# gemmd - GPU matrix-multiplication service.
#
#   make            build bin/gemmd, bin/gemm, lib/libgemm.{a,so} (never installs packages:
#                   it names the missing ones and stops)
#   make run        install missing packages, build and start the daemon (GPU if present)
#   make test       install missing packages, build and run every test this machine can run
#   make test-san   the unit and end-to-end tests under AddressSanitizer + UBSan
#   make deps       install the packages the build needs (apt-get as root)
#   make gpu-sanitize  compute-sanitizer memcheck + racecheck on every kernel (GPU machine)
#   make bench      build the benchmark programs (bench/)
#   make lint       cppcheck over the C sources;  make fuzz  libFuzzer runs over the codecs
#   make install    PREFIX=/usr/local DESTDIR=: daemon, client, library, headers, gemm.pc,
#                   config, systemd unit, docs;  make uninstall  removes them
#
# Options: CUDA=0|1 (default: 1 when nvcc is found), CUDA_ARCHS="80 90 90a" (SASS targets,
# PTX of the highest plain one is added), SAN=1 (sanitizer build in build-san/), V=1.
#
# Layout conventions (new files are picked up without editing this file):
#   common/*.c            shared by server and client (types, codecs)
#   server/*.c            the daemon (server/main.c holds main)
#   kernels/*.c           engine interface and CPU backend
#   kernels/cuda/*.c|*.cu CUDA engine and kernel family (only when CUDA=1)
#   client/lib/*.c        libgemm;  client/cli/*.c  the gemm command
#   tests/unit/test_*.c   one cmocka program each
#   tests/gpu/*.c|*.cu    one GPU test program each (CUDA=1)
#   bench/*.c|*.cu        one benchmark program each (`make bench`)

SHELL := /bin/bash
.DEFAULT_GOAL := all

# ---------------------------------------------------------------- toolchain
CC ?= cc
ifeq ($(CC),cc)
CC := gcc
endif
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(NVCC),1,0)
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
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
# nvcc links .cu programs itself and does not take -Wl,...: pass those through -Xlinker.
comma := ,
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

obj = $(patsubst %,$(BUILD)/obj/%.o,$(basename $(1)))

COMMON_OBJ := $(call obj,$(COMMON_SRC))
CORE_OBJ := $(COMMON_OBJ) $(call obj,$(SERVER_SRC) $(KERNEL_SRC) $(CUDA_C_SRC) $(CUDA_CU_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
CLI_OBJ := $(call obj,$(CLI_SRC))

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

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
ifeq ($(CUDA),1)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c tests/gpu/*.cu)
endif
GPU_TEST_BIN := $(patsubst tests/gpu/%,$(BUILD)/tests/gpu/%,$(basename $(GPU_TEST_SRC)))
BENCH_SRC := $(wildcard bench/*.c) $(if $(filter 1,$(CUDA)),$(wildcard bench/*.cu))
BENCH_BIN := $(patsubst bench/%,$(BUILD)/bench/%,$(basename $(BENCH_SRC)))
EXAMPLE_SRC := $(wildcard docs/examples/*.c)
EXAMPLE_BIN := $(patsubst docs/examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC))

# ---------------------------------------------------------------- top-level targets
.PHONY: all deps deps-test build run test test-san check-tests gpu-sanitize bench clean info

# Plain `make` only checks for packages (and prints the apt-get line); run, test and deps
# install them.
DEPS_KINDS := build $(if $(filter 1,$(CUDA)),cuda)
all:
	$(Q)scripts/deps.sh --check $(DEPS_KINDS)
	$(Q)$(MAKE) --no-print-directory build

info:
	@echo "gemmd build: CC=$(CC) CUDA=$(CUDA)$(if $(filter 1,$(CUDA)), (nvcc $(NVCC), archs $(CUDA_ARCHS)), (no nvcc found: CPU backend only))$(if $(filter 1,$(SAN)), SAN=1 (ASan+UBSan in $(BUILD)),)"

deps:
	$(Q)scripts/deps.sh $(DEPS_KINDS)

deps-test:
	$(Q)scripts/deps.sh $(DEPS_KINDS) test

build: info $(GEMMD) $(GEMM) $(LIBGEMM_A) $(LIBGEMM_SO) $(LIBDIR)/pkgconfig/gemm.pc \
       $(LIBDIR)/pkgconfig/gemm-static.pc

run: deps
	$(Q)$(MAKE) --no-print-directory build
	@echo "starting $(GEMMD) with config/gemmd.conf (Ctrl-C stops it)"
	$(GEMMD) --config config/gemmd.conf $(ARGS)

check-tests: build $(UNIT_BIN) $(GPU_TEST_BIN) $(EXAMPLE_BIN)

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
$(FLAGS_STAMP): FORCE
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
# make lint: cppcheck over every C source, in the CPU and the CUDA configuration. Checks:
# warning (likely bugs), style (redundant or dead code, always-true conditions; its
# purely stylistic variableScope is off), performance, portability. A finding fails; a
# false positive gets an inline `// cppcheck-suppress id` with the reason beside it, or,
# in code another change is rewriting, an entry in scripts/cppcheck-suppressions.
CPPCHECK ?= cppcheck
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
