# Front end for the CMake build. `make demo` and `make test` work on a fresh machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

MAIN_ARGS := -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
ASAN_ARGS := -DCMAKE_BUILD_TYPE=Debug -DK3_CUDA=OFF -DK3_SANITIZE=ON

.PHONY: all build configure demo test test-asan clean fuzz fuzz-build

all: build

# $(call configure,DIR,ARGS): each build folder keeps the arguments it was configured with (k3-configure-args).
# When they differ from this call's, the folder is configured afresh: its cache and compiler checks are dropped
# (a cached option that ARGS no longer sets would otherwise stay), its object files kept (make rebuilds those
# whose flags changed). So a changed CMAKE_ARGS needs no `make clean`.
shq = '$(subst ','\'',$(1))'
define configure
	@if [ ! -f $(1)/CMakeCache.txt ] || [ "$$(cat $(1)/k3-configure-args 2>/dev/null)" != $(call shq,$(2)) ]; then \
	    echo "configuring $(1): cmake "$(call shq,$(2)); \
	    rm -rf $(1)/CMakeCache.txt $(1)/CMakeFiles/[0-9]* $(1)/k3-configure-args; \
	    cmake -S . -B $(1) $(2) && printf '%s\n' $(call shq,$(2)) >$(1)/k3-configure-args; \
	fi
endef

configure:
	$(call configure,$(BUILD),$(MAIN_ARGS))

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job on the embedded default: CUDA when a GPU is present, else the CPU backend.
demo: build
	./$(BUILD)/k3 demo

# Every test: the main build (CPU tests; GPU tests run or report skipped), then the CPU tests under ASan+UBSan.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan

test-asan:
	$(call configure,$(ASAN_BUILD),$(ASAN_ARGS))
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -E '^gpu_'

# ---- fuzzing (clang + libFuzzer; CPU-only) ----------------------------------------------------------------------
# `make fuzz` builds the targets of tests/fuzz/ with -fsanitize=fuzzer,address,undefined against a CPU-only clang
# build of the library (build-fuzz: the same sources, compiled with the sanitizers and the fuzzer's coverage), then
# runs each for FUZZ_SECONDS, seeded from tests/fuzz/corpus/<target>/. New interesting inputs go to
# build-fuzz/corpus/<target>/ (the committed seeds are not changed); a crash, leak, timeout or out-of-memory stops
# that target with a non-zero exit and leaves its input in build-fuzz/artifacts/<target>/: copy it to
# tests/fuzz/crashes/<target>/, where the replay tests of `make test` (fuzz_replay_*) run it from then on.
# Targets run one after another; `make -j2 fuzz` runs them side by side. A new target is a file
# tests/fuzz/fuzz_<name>.c with seeds in tests/fuzz/corpus/fuzz_<name>/, added to FUZZ_TARGETS.
FUZZ_BUILD    ?= build-fuzz
FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 60
FUZZ_TARGETS  ?= fuzz_safetensors fuzz_table fuzz_index fuzz_ckpt_names
FUZZ_MAX_LEN  ?= 65536
FUZZ_RSS_MB   ?= 2048
FUZZ_TIMEOUT  ?= 10
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_ARGS     := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_CUDA=OFF -DK3_SANITIZE=ON -DCMAKE_C_COMPILER=$(FUZZ_CC) \
                 -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link
FUZZ_BINS     := $(addprefix $(FUZZ_BUILD)/bin/,$(FUZZ_TARGETS))

fuzz-build:
	$(call configure,$(FUZZ_BUILD),$(FUZZ_ARGS))
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target k3_static
	@mkdir -p $(FUZZ_BUILD)/bin
	@for t in $(FUZZ_TARGETS); do \
	    echo "linking $(FUZZ_BUILD)/bin/$$t"; \
	    $(FUZZ_CC) -std=c11 -g -O1 -Wall -Wextra -Werror -Wno-unused-parameter -fsanitize=fuzzer $(FUZZ_SAN) \
	        -Iinclude -Isrc tests/fuzz/$$t.c $(FUZZ_BUILD)/libk3.a -lm -o $(FUZZ_BUILD)/bin/$$t || exit 1; \
	done

fuzz: $(addprefix fuzz-run-,$(FUZZ_TARGETS))

fuzz-run-%: fuzz-build
	@mkdir -p $(FUZZ_BUILD)/corpus/$* $(FUZZ_BUILD)/artifacts/$*
	@echo "fuzzing $* for $(FUZZ_SECONDS) s (log: $(FUZZ_BUILD)/$*.log)"
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ./$(FUZZ_BUILD)/bin/$* -max_total_time=$(FUZZ_SECONDS) -max_len=$(FUZZ_MAX_LEN) \
	    -rss_limit_mb=$(FUZZ_RSS_MB) -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$*/ \
	    $(FUZZ_BUILD)/corpus/$* tests/fuzz/corpus/$* >$(FUZZ_BUILD)/$*.log 2>&1 \
	    || { tail -n 60 $(FUZZ_BUILD)/$*.log; echo "fuzz: $* FAILED (input in $(FUZZ_BUILD)/artifacts/$*/)"; exit 1; }
	@grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^Done' $(FUZZ_BUILD)/$*.log || true

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
