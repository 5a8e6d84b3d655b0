# Front end for the CMake build. `make demo` and `make test` work on a fresh machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

MAIN_ARGS := -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
ASAN_ARGS := -DCMAKE_BUILD_TYPE=Debug -DK3_CUDA=OFF -DK3_SANITIZE=ON

.PHONY: all build configure demo test test-asan clean

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

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
