/* The pod sandbox's process (what the kubelet's pause image runs): holds the pod's namespaces,
 * reaps the zombies of processes that share its PID namespace, exits on SIGINT or SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(0); }

static void reap(int sig) {
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void) {
	struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	/* In a pod that shares the host's PID namespace (hostPID) it is not the first process. */
	if (getpid() != 1)
		fprintf(stderr, "pause: not PID 1: zombies are reaped by another\n");
	if (sigaction(SIGINT, &q, NULL) || sigaction(SIGTERM, &q, NULL) || sigaction(SIGCHLD, &r, NULL))
		return 2;
	for (;;)
		pause();
}
