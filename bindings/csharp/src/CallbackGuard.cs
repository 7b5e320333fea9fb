using System;
using System.Runtime.ExceptionServices;

namespace H2o
{
    /// <summary>Managed exceptions must not cross into C. A callback's exception is caught here,
    /// the callback tells the library to stop, and the exception is rethrown (with its original
    /// stack) once the library call has returned.</summary>
    internal sealed class CallbackGuard
    {
        private ExceptionDispatchInfo caught;

        internal bool Failed => caught != null;

        internal int Run(Func<int> body, int stop)
        {
            if (caught != null) return stop;
            try
            {
                return body();
            }
            catch (Exception e)
            {
                caught = ExceptionDispatchInfo.Capture(e);
                return stop;
            }
        }

        internal void RethrowIfFailed()
        {
            ExceptionDispatchInfo failed = caught;
            caught = null;
            failed?.Throw();
        }
    }
}
