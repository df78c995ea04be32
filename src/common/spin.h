/* src/common: one pause of a polling loop (docs/pool.md, section 8): tells
 * the CPU that this thread spins, which frees the core's shared resources
 * for its sibling and saves power; nothing on other architectures. Any
 * thread. */
#ifndef ST_COMMON_SPIN_H
#define ST_COMMON_SPIN_H

static inline void st__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#endif
