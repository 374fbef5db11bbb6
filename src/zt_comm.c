/* zt_comm.c — being written */
