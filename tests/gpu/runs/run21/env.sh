# Sourced by the calls of run21: the device's paths after tests/gpu/run_all.sh build.
export LD_LIBRARY_PATH=/opt/kaon-deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64 PYTHONPATH=/tmp/site
export KAON_BUILD=$PWD/build-gpu KAON_GPU_DRIVER=$PWD/build-gpu/gpu_driver PATH=/usr/local/cuda/bin:$PATH
