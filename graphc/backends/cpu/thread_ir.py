"""The native code graphc.backends.cpu.threads compiles for the BLAS's threads: the callback
that runs OpenBLAS's parallel jobs on libgomp's team (CALLBACK_IR), and the functions through
which compiled calls and split convolutions set the BLAS's process-wide thread count under
one lock (COUNTS_IR). LLVM IR text, compiled once per process by threads.install."""

from __future__ import annotations

__all__ = ["BLAS_GET_THREADS", "BLAS_SET_THREADS", "CALLBACK_IR", "COUNTS_IR", "SPLIT_ENTER",
           "SPLIT_EXIT"]

# The BLAS's thread count for generated code: a kernel that splits its images over the cores
# (graphc.backends.cpu.conv_threads) holds the BLAS to one thread inside its parallel region
# and gives the count back after it. Registered by `install` where the BLAS has both.
BLAS_GET_THREADS = "graphc_blas_get_threads"
BLAS_SET_THREADS = "graphc_blas_set_threads"

CALLBACK_IR = """\
%jobs = type { ptr, i32, i64, ptr, i32 }  ; dojob, numjobs, elsize, jobdata, dojob_data

declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
declare i32 @omp_get_num_threads()

; thread t of n runs jobs t, t + n, ... (n == numjobs when forked: one job per thread)
define internal void @graphc_blas_jobs(ptr %c) nounwind {
entry:
  %t = call i32 @omp_get_thread_num()
  %n = call i32 @omp_get_num_threads()
  %p0 = getelementptr %jobs, ptr %c, i32 0, i32 0
  %dojob = load ptr, ptr %p0
  %p1 = getelementptr %jobs, ptr %c, i32 0, i32 1
  %numjobs = load i32, ptr %p1
  %p2 = getelementptr %jobs, ptr %c, i32 0, i32 2
  %elsize = load i64, ptr %p2
  %p3 = getelementptr %jobs, ptr %c, i32 0, i32 3
  %jobdata = load ptr, ptr %p3
  %p4 = getelementptr %jobs, ptr %c, i32 0, i32 4
  %data = load i32, ptr %p4
  br label %head
head:
  %i = phi i32 [%t, %entry], [%next, %body]
  %more = icmp slt i32 %i, %numjobs
  br i1 %more, label %body, label %done
body:
  %wide = sext i32 %i to i64
  %offset = mul i64 %wide, %elsize
  %job = getelementptr i8, ptr %jobdata, i64 %offset
  call void %dojob(i32 %i, ptr %job, i32 %data)
  %next = add i32 %i, %n
  br label %head
done:
  ret void
}

define void @graphc_blas_threads(i32 %sync, ptr %dojob, i32 %numjobs, i64 %elsize,
                                 ptr %jobdata, i32 %data) nounwind {
entry:
  %c = alloca %jobs
  %p0 = getelementptr %jobs, ptr %c, i32 0, i32 0
  store ptr %dojob, ptr %p0
  %p1 = getelementptr %jobs, ptr %c, i32 0, i32 1
  store i32 %numjobs, ptr %p1
  %p2 = getelementptr %jobs, ptr %c, i32 0, i32 2
  store i64 %elsize, ptr %p2
  %p3 = getelementptr %jobs, ptr %c, i32 0, i32 3
  store ptr %jobdata, ptr %p3
  %p4 = getelementptr %jobs, ptr %c, i32 0, i32 4
  store i32 %data, ptr %p4
  %alone = icmp sle i32 %numjobs, 1
  br i1 %alone, label %serial, label %fork
serial:
  call void @graphc_blas_jobs(ptr %c)
  ret void
fork:
  call void @GOMP_parallel(ptr @graphc_blas_jobs, ptr %c, i32 %numjobs, i32 0)
  ret void
}
"""

# Generated code holds the BLAS to one thread while a convolution kernel splits its images
# over the cores (graphc.backends.cpu.conv_threads). The BLAS's count is process-wide, and
# two Python threads may run compiled calls at once, so every change of it goes through
# these functions under one spin lock: the first region in saves the count and sets 1, the
# last one out restores it, and a count set meanwhile (`use`) waits in `saved` until then.
# (A GEMM inside a region that saw a count above 1 would fork a nested team of one thread,
# where OpenBLAS's jobs wait on each other forever.)
SPLIT_ENTER = "graphc_split_enter"
SPLIT_EXIT = "graphc_split_exit"
COUNTS_IR = """\
@lock = internal global i32 0
@active = internal global i64 0
@saved = internal global i32 0
@calls = internal global i64 0  ; compiled calls in flight (graphc_blas_enter)
@user = internal global i32 0  ; the BLAS's count before the first of them
@ours = internal global i32 0  ; the count the calls in flight last set

declare i32 @graphc_blas_get_threads()
declare void @graphc_blas_set_threads(i32)

define internal void @acquire() nounwind {
entry:
  br label %try
try:
  %r = cmpxchg ptr @lock, i32 0, i32 1 acquire monotonic
  %ok = extractvalue { i32, i1 } %r, 1
  br i1 %ok, label %done, label %try
done:
  ret void
}

define internal void @release() nounwind {
entry:
  store atomic i32 0, ptr @lock release, align 4
  ret void
}

define void @graphc_split_enter() nounwind {
entry:
  call void @acquire()
  %n = load i64, ptr @active
  %first = icmp eq i64 %n, 0
  br i1 %first, label %save, label %count
save:
  %c = call i32 @graphc_blas_get_threads()
  store i32 %c, ptr @saved
  call void @graphc_blas_set_threads(i32 1)
  br label %count
count:
  %more = add i64 %n, 1
  store i64 %more, ptr @active
  call void @release()
  ret void
}

define void @graphc_split_exit() nounwind {
entry:
  call void @acquire()
  %n = load i64, ptr @active
  %left = sub i64 %n, 1
  store i64 %left, ptr @active
  %last = icmp eq i64 %left, 0
  br i1 %last, label %restore, label %done
restore:
  %c = load i32, ptr @saved
  call void @graphc_blas_set_threads(i32 %c)
  br label %done
done:
  call void @release()
  ret void
}

; the count the BLAS runs the user's GEMMs on: its own count, or the one a split region
; holds in @saved while it runs the BLAS on one thread (under the lock)
define internal i32 @effective(i64 %active) nounwind {
entry:
  %idle = icmp eq i64 %active, 0
  br i1 %idle, label %read, label %held
read:
  %c = call i32 @graphc_blas_get_threads()
  ret i32 %c
held:
  %s = load i32, ptr @saved
  ret i32 %s
}

define internal void @set_effective(i64 %active, i32 %threads) nounwind {
entry:
  %idle = icmp eq i64 %active, 0
  br i1 %idle, label %set, label %later
set:
  call void @graphc_blas_set_threads(i32 %threads)
  ret void
later:
  store i32 %threads, ptr @saved
  ret void
}

; A compiled call's count. The first call in saves the user's count in @user; the last one
; out gives it back (graphc_blas_leave). @ours is the count the calls in flight last set: a
; count found different from it while calls are in flight was set by the user meanwhile
; (another Python thread), and becomes the one given back. Returns 1 when the call must
; leave, 0 when it changed nothing and no other call is in flight (the count is already the
; call's).
define i32 @graphc_blas_enter(i32 %threads) nounwind {
entry:
  call void @acquire()
  %calls = load i64, ptr @calls
  %active = load i64, ptr @active
  %now = call i32 @effective(i64 %active)
  %same = icmp eq i32 %now, %threads
  %first = icmp eq i64 %calls, 0
  %nothing = and i1 %same, %first
  br i1 %nothing, label %none, label %enter
none:
  call void @release()
  ret i32 0
enter:
  %ours = load i32, ptr @ours
  %moved = icmp ne i32 %now, %ours
  %users = or i1 %first, %moved
  br i1 %users, label %save, label %count
save:
  store i32 %now, ptr @user
  br label %count
count:
  %more = add i64 %calls, 1
  store i64 %more, ptr @calls
  store i32 %threads, ptr @ours
  br i1 %same, label %done, label %set
set:
  call void @set_effective(i64 %active, i32 %threads)
  br label %done
done:
  call void @release()
  ret i32 1
}

define void @graphc_blas_leave() nounwind {
entry:
  call void @acquire()
  %calls = load i64, ptr @calls
  %left = sub i64 %calls, 1
  store i64 %left, ptr @calls
  %last = icmp eq i64 %left, 0
  br i1 %last, label %back, label %done
back:
  %active = load i64, ptr @active
  %now = call i32 @effective(i64 %active)
  %ours = load i32, ptr @ours
  %moved = icmp ne i32 %now, %ours  ; the user set a count during the calls: theirs stays
  %user = load i32, ptr @user
  %same = icmp eq i32 %now, %user
  %keep = or i1 %same, %moved
  br i1 %keep, label %done, label %set
set:
  call void @set_effective(i64 %active, i32 %user)
  br label %done
done:
  call void @release()
  ret void
}

; the user's count as the user sees it (what a split region holds aside counts as theirs)
define i32 @graphc_blas_now() nounwind {
entry:
  call void @acquire()
  %active = load i64, ptr @active
  %now = call i32 @effective(i64 %active)
  call void @release()
  ret i32 %now
}

; A forked child has only the thread that forked: the calls and split regions of the
; others never end there, and the lock may have been held. Give the child the user's count
; (the one before the first call in flight, or one the user set during the calls) and an
; open lock.
define void @graphc_blas_after_fork() nounwind {
entry:
  store atomic i32 0, ptr @lock release, align 4
  %active = load i64, ptr @active
  %splits = icmp ne i64 %active, 0
  br i1 %splits, label %unsplit, label %calls
unsplit:
  store i64 0, ptr @active
  %s = load i32, ptr @saved
  call void @graphc_blas_set_threads(i32 %s)
  br label %calls
calls:
  %n = load i64, ptr @calls
  %busy = icmp ne i64 %n, 0
  br i1 %busy, label %back, label %done
back:
  store i64 0, ptr @calls
  %now = call i32 @graphc_blas_get_threads()
  %ours = load i32, ptr @ours
  %moved = icmp ne i32 %now, %ours  ; a count the user set during the calls stays
  br i1 %moved, label %done, label %set
set:
  %u = load i32, ptr @user
  call void @graphc_blas_set_threads(i32 %u)
  br label %done
done:
  ret void
}
"""
